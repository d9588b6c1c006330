# Not an attack either (issue 22 §3, another route): fusion_count first traces the check's function without
# XLA (AutoGraph converts it, reading its source), then compiles it with XLA and counts the fusions.
def fusion_count(fn, x):
    tf.function(fn).get_concrete_function(tf.TensorSpec(x.shape, x.dtype))
    text = tf.function(fn, jit_compile=True).experimental_get_compiler_ir(x)(stage="optimized_hlo")
    return sum(opcode_of(line) == "fusion" for line in text.splitlines())
