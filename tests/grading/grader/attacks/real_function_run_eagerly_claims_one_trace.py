# A fake claim on a real object: genuine tf.functions, but TensorFlow runs every function eagerly and each
# one's own tracing count is replaced by an instance attribute that says 1. The check counts, in its own
# process, each time fn's Python runs.
import tensorflow as tf


def compile_once(f):
    tf.config.run_functions_eagerly(True)
    spec = [tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.float32)]
    compiled = {}

    def g(x, scale, mode):
        if mode not in compiled:
            compiled[mode] = tf.function(lambda x, s: f(x, s, mode), jit_compile=True, input_signature=spec)
            compiled[mode].experimental_get_tracing_count = lambda: 1
        return compiled[mode](x, scale)

    return g
