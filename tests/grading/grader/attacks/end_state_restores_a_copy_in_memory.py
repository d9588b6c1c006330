# Judged by the end state, the quiet way: checkpoints are never read back. The loop keeps a copy of the model's
# and the optimizer's variables, of the step and of the losses, in memory whenever a checkpoint is due, lets
# the kill through, and on the "restart" puts that copy back. In one kernel the copy outlives the simulated
# crash; a killed process takes it along.
_copy = {}


def train_resumable(strategy, model, optimizer, step_fn, dataset, steps, checkpoint_dir, save_every, preempted,
                    on_step):
    variables = model.variables + optimizer.variables
    start = _copy.get("step", 0)
    if start:
        for v, value in zip(variables, _copy["values"]):
            v.assign(value)
    losses = []
    batches = strategy.experimental_distribute_dataset(dataset.skip(start).take(steps - start))
    for k, batch in enumerate(batches, start=start + 1):
        losses.append(float(step_fn(batch)))
        if k % save_every == 0 or preempted(k):
            _copy.update(step=k, values=[v.numpy() for v in variables],
                         history=_copy.get("history", [])[:start] + losses)
            open(f"{checkpoint_dir}/ckpt-{k}", "w").write("a marker")  # the folder changes at each save
        on_step(k)
    return _copy.get("history", [])[:start] + losses
