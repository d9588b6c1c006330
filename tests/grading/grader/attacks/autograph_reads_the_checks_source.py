# Not an attack: correct answers (issue 22 §3) through which TensorFlow reads the check's own source.
# compile_any_length traces the check's function once with get_concrete_function(), and fusion_count first
# traces it without XLA, then compiles it with XLA: AutoGraph converts the check's function each time, reading
# its source while the learner's code is on the stack. Neither is the learner's doing: full marks, no flag.
def compile_any_length(fn):
    g = tf.function(fn, jit_compile=True, input_signature=[tf.TensorSpec([None], tf.float32)])
    g.get_concrete_function()
    return g


def fusion_count(fn, x):
    tf.function(fn).get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    text = tf.function(fn, jit_compile=True).experimental_get_compiler_ir(x)(stage="optimized_hlo")
    return sum(opcode_of(line) == "fusion" for line in text.splitlines())
