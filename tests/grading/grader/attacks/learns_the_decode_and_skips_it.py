# A stage's work learned and skipped (issue 34): tuned_pipeline calls the check's decode on two records,
# works out that it is v -> c * v, and computes every other record itself, so the slow decode seems to cost
# nothing. The check follows each element the step gets back to the decode (and read) that produced it, on
# its own records: elements no decode produced do not count.
def tuned_pipeline(files, read_file, decode, costs):
    c = decode.fn(1) - decode.fn(0)
    fast = files.interleave(read_file, cycle_length=costs["shards"], num_parallel_calls=costs["shards"])
    options = tf.data.Options()
    options.threading.private_threadpool_size = costs["shards"] + 4
    return fast.map(lambda v: c * v).with_options(options).prefetch(tf.data.AUTOTUNE)
