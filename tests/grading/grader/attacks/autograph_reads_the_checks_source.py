# Not an attack: correct answers (issue 22 §3) through which TensorFlow reads the check's own source.
# compile_once traces the check's function for each mode with get_concrete_function(), and fusion_count first
# traces it without XLA, then compiles it with XLA: AutoGraph converts the check's function each time, reading
# its source while the learner's code is on the stack. Neither is the learner's doing: full marks, no flag.
def compile_once(fn):
    spec = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32)]
    traced = {mode: tf.function(lambda x, s, m=mode: fn(x, s, m), jit_compile=True).get_concrete_function(*spec)
              for mode in ("train", "eval")}
    return lambda x, scale, mode: traced[mode](x, tf.constant(scale, tf.float32))


def fusion_count(fn, x):
    tf.function(fn).get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    text = tf.function(fn, jit_compile=True).experimental_get_compiler_ir(x)(stage="optimized_hlo")
    return sum(opcode_of(line) == "fusion" for line in text.splitlines())
