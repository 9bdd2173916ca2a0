"""Sets two profiler traces of the same work side by side (bench_gpu --trace writes them: ours and the anchor).

For each trace: wall time, the GPU's span, busy and idle time (the union of kernels, copies and memsets),
kernel launches, the host's waits for the GPU (synchronizing CUDA calls), and GPU time by kind of kernel;
then the kernels whose total time differs most between the two. Reads Chrome-trace JSON (Kineto's format,
which both LibTorch and torch.profiler write).
usage: trace_summary.py OURS.json ANCHOR.json [--top N]
"""
import argparse
import collections
import json
import re

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
# Calls that make the host wait for the GPU, and the asynchronous copy (which waits when its host memory is pageable).
WAITS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync"}
KINDS = [  # first match wins
    ("optimizer", r"adam|multi_tensor_apply|foreach"),
    ("convolution", r"conv|xmma|implicit_gemm|cudnn|winograd|dgrad|wgrad|fprop|nhwc.*kernel|cutlass"),
    ("batch norm", r"batch_norm|batchnorm|bn_|welford"),
    ("matmul", r"gemm|matmul|sm90_|ampere_|cublas"),
    ("pooling", r"pool"),
    ("reduction", r"reduce|sum_|softmax|nll|cross_entropy|argmax|max_"),
    ("copy / layout", r"copy|memcpy|memset|transpose|nchw|permute|cat"),
    ("elementwise", r"elementwise|vectorized|unrolled|relu|add|mul|threshold|fill"),
]


def load(path):
    with open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def kind_of(name):
    low = name.lower()
    for kind, pattern in KINDS:
        if re.search(pattern, low):
            return kind
    return "other"


def short(name, width=90):
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def summarize(events):
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    gpu = sorted((e for e in spans if e.get("cat") in GPU_CATS), key=lambda e: float(e["ts"]))
    out = {"events": len(spans)}
    if spans:
        out["wall_ms"] = (max(float(e["ts"]) + float(e["dur"]) for e in spans) - min(float(e["ts"]) for e in spans)) / 1e3
    busy, end = 0.0, None
    for e in gpu:
        start, stop = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if end is None or start >= end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    span = (float(gpu[-1]["ts"]) + float(gpu[-1]["dur"]) - float(gpu[0]["ts"])) if gpu else 0.0
    out.update(gpu_span_ms=span / 1e3, gpu_busy_ms=busy / 1e3, gpu_idle_ms=(span - busy) / 1e3)
    kernels = [e for e in gpu if e.get("cat") == "kernel"]
    out["kernels"] = len(kernels)
    by_kind, by_name = collections.Counter(), collections.defaultdict(lambda: [0.0, 0])
    for e in gpu:
        by_kind[kind_of(e["name"])] += float(e["dur"]) / 1e3
        entry = by_name[short(e["name"])]
        entry[0] += float(e["dur"]) / 1e3
        entry[1] += 1
    out["by_kind"], out["by_name"] = by_kind, by_name
    waits = collections.defaultdict(lambda: [0, 0.0])
    for e in spans:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in WAITS:
            waits[e["name"]][0] += 1
            waits[e["name"]][1] += float(e["dur"]) / 1e3
    out["waits"] = waits
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("ours")
    p.add_argument("anchor")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args()
    ours, anchor = summarize(load(a.ours)), summarize(load(a.anchor))
    print(f"{'':34} {'ours':>12} {'anchor':>12}")
    for key in ("wall_ms", "gpu_span_ms", "gpu_busy_ms", "gpu_idle_ms", "kernels"):
        print(f"{key:34} {ours.get(key, 0):12.2f} {anchor.get(key, 0):12.2f}")
    print("host waits for the GPU (count, ms):")
    for name in sorted(set(ours["waits"]) | set(anchor["waits"])):
        o, t = ours["waits"].get(name, [0, 0.0]), anchor["waits"].get(name, [0, 0.0])
        print(f"  {name:32} {o[0]:5d} {o[1]:8.2f}   {t[0]:5d} {t[1]:8.2f}")
    print("GPU time by kind (ms):")
    for kind in sorted(set(ours["by_kind"]) | set(anchor["by_kind"]), key=lambda k: -ours["by_kind"][k]):
        print(f"  {kind:32} {ours['by_kind'][kind]:12.2f} {anchor['by_kind'][kind]:12.2f}")
    names = set(ours["by_name"]) | set(anchor["by_name"])
    zero = [0.0, 0]
    diff = sorted(names, key=lambda n: -abs(ours["by_name"].get(n, zero)[0] - anchor["by_name"].get(n, zero)[0]))
    print("kernels whose GPU time differs most (ms, count): ours | anchor")
    for n in diff[: a.top]:
        o, t = ours["by_name"].get(n, zero), anchor["by_name"].get(n, zero)
        print(f"  {o[0]:8.2f} {o[1]:5d} | {t[0]:8.2f} {t[1]:5d}  {n}")


if __name__ == "__main__":
    main()
