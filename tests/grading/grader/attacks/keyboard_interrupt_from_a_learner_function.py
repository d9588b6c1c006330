# A KeyboardInterrupt from a learner function (issue 34): it once turned the whole submission into an error.
# On the solved lab, visible_gpu_count raises it (a BaseException, as a learner's Ctrl-C handler might): only
# q4 fails, and every other item is still graded.
def visible_gpu_count(value, physical):
    raise KeyboardInterrupt("pressed Ctrl-C")
