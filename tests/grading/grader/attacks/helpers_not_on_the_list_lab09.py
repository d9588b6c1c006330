# Answers from helpers not on the list (issue 34, "How they did it" 7): a 1x1 convolution's cost is a matmul's
# (gpucourse.mfu.conv2d_cost with kernel=1: 2*m*n*k FLOPs and the same three tensors), dense_train_flops is
# scaling.train_flops of the layer's parameters, and step_mfu is mfu.mfu. Lab 09 forbids gpucourse.mfu and
# gpucourse.roofline (they cannot even be imported in the graded kernel), and scaling.train_flops is marked
# as answering it: each item raises LabRuleError.
import importlib


def arithmetic_intensity(m, n, k, dtype):
    mfu = importlib.import_module("gpucourse.mfu")
    cost = mfu.conv2d_cost(batch=1, height=m, width=1, c_in=k, c_out=n, kernel=1, dtype=dtype)
    return cost.flops / cost.bytes


def dense_train_flops(batch, d_in, d_out):
    from gpucourse import scaling

    return scaling.train_flops(d_in * d_out, batch)


def step_mfu(params, tokens, step_s, sheet, dtype):
    from gpucourse.mfu import mfu

    return mfu(6 * params * tokens, step_s, sheet["dense"][dtype])
