"""Lab 04's reference answers: the batch arithmetic and one-device training each item's judge compares with.

How TensorFlow and ``np.array_split`` split a batch over replicas, which examples each replica gets at each step
of q2's pipelines, q3's two-head step (right, and with each classic mistake's divisors) and q5's SGD with
momentum, all in NumPy on the grader's side. Used by :mod:`gpucourse.labtests._lab04_judges`; never sent to the
graded kernel.
"""

from __future__ import annotations

__all__ = ["AUX", "L2", "MAIN", "array_split", "q2_steps", "q3_reference", "sgd_linear", "tf_split"]


def tf_split(batch: int, replicas: int) -> list[int]:
    """TensorFlow's split of a batch over replicas: ceil(batch / replicas) each, in order, until it runs out."""
    per = -(-batch // replicas)
    return [max(0, min(per, batch - i * per)) for i in range(replicas)]


# --------------------------------------------------------------------------- q2


def array_split(total: int, parts: int) -> list[int]:
    """``np.array_split``'s sizes: ``total`` examples over ``parts`` replicas, the first ``total % parts`` one more."""
    return [total // parts + (1 if j < total % parts else 0) for j in range(parts)]


def q2_steps(case, pipes) -> list[list[list[float]]]:
    """What each replica gets at each step: pipeline p's batches go to its replicas p*r ... p*r + r - 1 in turn
    (r = replicas / pipelines), as ``distribute_datasets_from_function`` deals them; a pipeline that ends first
    leaves its replicas empty."""
    replicas, pipelines = case["replicas"], case["pipelines"]
    r = replicas // pipelines
    count = max([-(-len(p["batches"]) // r) for p in pipes] + [0])
    steps = [[[] for _ in range(replicas)] for _ in range(count)]
    for p, pipe in enumerate(pipes):
        for j, batch in enumerate(pipe["batches"]):
            steps[j // r][p * r + j % r] = batch["x"]
    return steps


# --------------------------------------------------------------------------- q3


def sgd_linear(kernel, bias, batches, lr, momentum=0.0, velocity=None):
    """Reference: SGD (Keras' momentum rule) on mean-over-outputs squared error, loss summed / batch size.

    Returns (losses, kernel, bias, velocity). Plain Python, float64.
    """
    import numpy as np

    w, b = np.array(kernel, float), np.array(bias, float)
    vw, vb = velocity if velocity is not None else (np.zeros_like(w), np.zeros_like(b))
    losses = []
    for x, y in batches:
        x, y = np.array(x, float), np.array(y, float)
        pred = x @ w + b
        losses.append(float(np.mean(np.mean((y - pred) ** 2, axis=1))))
        d = -2.0 * (y - pred) / (y.shape[1] * x.shape[0])
        gw, gb = x.T @ d, d.sum(axis=0)
        vw, vb = momentum * vw - lr * gw, momentum * vb - lr * gb
        w, b = w + vw, b + vb
    return losses, w, b, (vw, vb)


#: How each head's per-example errors are weighted, right and in the classic mistakes. ``n``/``labelled``: examples
#: and labelled examples in the whole step; ``n_r``/``labelled_r``: on the example's own replica; R: replicas.
MAIN = {"right": "1 / n", "local": "1 / (n_r R)"}


AUX = {"right": "aux has / labelled", "examples": "aux has / n", "local": "aux has / (labelled_r R)",
       "local_examples": "aux has / (n_r R)"}


L2 = {"right": 1, "per_replica": "R", "missing": 0}


def q3_reference(case, weights, rows, replicas, main="right", aux="right", l2="right"):
    """One SGD step of the two-head model on ``rows`` of the case, with each head's errors weighted as named
    (see ``MAIN``, ``AUX``, ``L2``); a zero denominator gives 0, as tf.math.divide_no_nan and
    tf.nn.compute_average_loss do. Returns (loss summed over the replicas, weights after). NumPy, float64."""
    import numpy as np

    x = np.array([case["x"][i] for i in rows], float)
    targets = [np.array([case[key][i] for i in rows], float) for key in ("y_main", "y_aux")]
    has = np.array([case["has_aux"][i] for i in rows], float)
    n, sizes = len(rows), tf_split(len(rows), replicas)
    replica = np.repeat(np.arange(replicas), sizes)
    n_r = np.array(sizes, float)[replica]
    labelled_r = np.array([has[replica == r].sum() for r in range(replicas)])[replica]

    def ratio(num, den):
        den = np.broadcast_to(np.asarray(den, float), np.shape(num))
        return np.divide(num, den, out=np.zeros(np.shape(num)), where=den != 0)

    coef = [{"right": ratio(np.ones(n), n), "local": ratio(np.ones(n), n_r * replicas)}[main],
            {"right": ratio(case["aux"] * has, has.sum()), "examples": ratio(case["aux"] * has, n),
             "local": ratio(case["aux"] * has, labelled_r * replicas),
             "local_examples": ratio(case["aux"] * has, n_r * replicas)}[aux]]
    factor = {"right": 1, "per_replica": replicas, "missing": 0}[l2]
    loss, after = 0.0, []
    for head, (c, y) in enumerate(zip(coef, targets)):
        w, b = np.array(weights[2 * head], float), np.array(weights[2 * head + 1], float)
        err = y - (x @ w + b)
        loss += float(np.sum(c * np.mean(err ** 2, axis=1))) + factor * case["l2"] * float(np.sum(w ** 2))
        d = -2.0 * err * c[:, None] / y.shape[1]
        after += [w - case["lr"] * (x.T @ d + 2 * factor * case["l2"] * w), b - case["lr"] * d.sum(axis=0)]
    return loss, after
