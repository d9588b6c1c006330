# Objects the check passes in, mutated (issue 22): the simulated stages' costs are set to zero, so a
# sequential pipeline looks fast.
def fast_pipeline(source, load, augment):
    load.seconds = augment.seconds = 0.0
    return source.map(load).map(augment)
