# A fabricated measurement (lab 09 q5): the op is launched and waited for, so the check sees calls, but the time
# reported is the roofline model's, max(FLOPs / peak, bytes / bandwidth), not a clock reading. The check's own
# clock timed every call: the tiny op took far longer than its roofline time.
def measure_roof(run, sync, flops, nbytes, peak_tflops, bandwidth_gbs):
    run()
    sync()
    for _ in range(5):
        run()
    sync()
    seconds = max(flops / (peak_tflops * 1e12), nbytes / (bandwidth_gbs * 1e9))
    tflops, gbs = flops / seconds / 1e12, nbytes / seconds / 1e9
    bound = "compute" if tflops / peak_tflops >= gbs / bandwidth_gbs else "memory"
    return {"seconds": seconds, "tflops": tflops, "gbs": gbs, "bound": bound}
