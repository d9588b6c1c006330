"""Lab 03 q4 without a kernel: which mistake the wrong weights are blamed on, and a check that prints only its verdict."""

import logging
import random

import pytest

from gpucourse.labtests import lab03

CASE = lab03.q4.cases(random.Random(3))[0]
RIGHT = {"optimizer": "SGD", "momentum": 0.0, "lr": CASE["lr"], "loss": "mse", "first": CASE["x"][0][0]}


@pytest.mark.parametrize("change, words", [
    ({"optimizer": "Adam"}, "Your model.optimizer is Adam"),
    ({"momentum": 0.9}, "momentum=0.9"),
    ({"lr": CASE["lr"] * 4}, "averages the accumulated gradients"),
    ({"loss": "mae"}, "compiled with the loss mae"),
    ({"first": CASE["x"][1][0] + 1.0}, "model.fit shuffles by default"),
    ({}, "Train in order (shuffle=False) with plain SGD and loss 'mse'."),
])
def test_q4_names_the_mistake_behind_wrong_weights(change, words):
    """Four mistakes used to share one generic hint (Adam among them); each now gets its own."""
    assert words in lab03._why_weights_differ(CASE, {**RIGHT, **change})


def test_q4_loss_names():
    import keras

    assert lab03._loss_name("mse") in lab03._MSE
    assert lab03._loss_name(keras.losses.MeanSquaredError()) in lab03._MSE
    assert lab03._loss_name(keras.losses.MeanSquaredError(reduction="sum")) not in lab03._MSE
    assert lab03._loss_name(keras.losses.mean_absolute_error) == "mean_absolute_error"


def test_q4_keeps_tensorflows_warnings_out_of_the_check_output():
    """A fresh model per check makes TensorFlow warn about retracing after a few checks: not the learner's business."""
    logger = logging.getLogger("tensorflow")
    before = logger.level
    with lab03._quiet_tensorflow():
        assert not logger.isEnabledFor(logging.WARNING) and logger.isEnabledFor(logging.ERROR)
    assert logger.level == before
