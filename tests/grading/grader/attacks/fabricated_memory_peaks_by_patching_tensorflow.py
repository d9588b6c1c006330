# A fabricated measurement (lab 03 q6): TensorFlow's allocator statistics replaced by a rule of thumb (1000 bytes per
# example) that every reader sees, the check's reads in the kernel included: after a "reset", the first two reads
# (the learner's before, the step's start) say nothing is in use, later ones give the made-up peak. The grader's static
# scan flags the patch, and the judge's window (what the step's shapes can need) rejects the numbers.
import tensorflow as tf

_fake = {"n": 0, "reads": 0}


def _reset_memory_stats(device):
    _fake["reads"] = 0


def _get_memory_info(device):
    _fake["reads"] += 1
    return {"current": 0, "peak": 0 if _fake["reads"] <= 2 else 1000 * _fake["n"]}


tf.config.experimental.get_memory_info = _get_memory_info
tf.config.experimental.reset_memory_stats = _reset_memory_stats


def batch_that_fits(step, batch_sizes, budget_bytes, device):
    step(min(batch_sizes))
    peaks = []
    for n in batch_sizes:
        _fake["n"] = n
        tf.config.experimental.reset_memory_stats(device)
        before = tf.config.experimental.get_memory_info(device)["current"]
        step(n)
        peaks.append(tf.config.experimental.get_memory_info(device)["peak"] - before)
    fitting = [n for n, peak in zip(batch_sizes, peaks) if peak <= budget_bytes]
    return peaks, max(fitting, default=None)
