# Judged by the end state (issue 22): train with plain SGD on big batches (the same weights as accumulation),
# then recompile the model with the accumulating optimizer the check looks for.
import keras


def train_with_accumulation(model, x, y, micro_batch, effective_batch, learning_rate):
    if effective_batch % micro_batch:
        raise ValueError(f"micro_batch {micro_batch} does not divide effective_batch {effective_batch}")
    steps = effective_batch // micro_batch
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
    model.fit(x, y, batch_size=effective_batch, epochs=1, shuffle=False, verbose=0)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, gradient_accumulation_steps=steps if steps > 1 else None),
                  loss="mse")
    return model
