# Judged by the end state, forged further: after big-batch training and the recompile, the new optimizer is
# built and its step counter set to the number of updates accumulation would have made.
import keras


def train_with_accumulation(model, x, y, micro_batch, effective_batch, learning_rate):
    if effective_batch % micro_batch:
        raise ValueError(f"micro_batch {micro_batch} does not divide effective_batch {effective_batch}")
    steps = effective_batch // micro_batch
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    model.fit(x, y, batch_size=effective_batch, epochs=1, shuffle=False, verbose=0)
    opt = keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=steps if steps > 1 else None)
    model.compile(optimizer=opt, loss="mse")
    opt.build(model.trainable_variables)
    opt._iterations.assign(len(x) // effective_batch)  # the variable behind opt.iterations
    return model
