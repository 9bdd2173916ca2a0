"""Times the 2x2 average pool of the xresnet's shortcut on a GPU: ATen's avg_pool2d against the same mean taken
over a (h/2, 2, w/2, 2) view, forward and backward, channels-last, on the shapes of bench_gpu's xresnet at 224 px
(batch 64). Checks first that both give the same values and gradients. Prints one line per shape and dtype.
usage: pool_kernels.py [--device cuda] [--repeats 50]
"""
import argparse

import torch
import torch.nn.functional as F


def by_pool(x):
    return F.avg_pool2d(x, 2, 2, ceil_mode=True)


def by_view(x):
    # x is channels-last: its NHWC permutation is contiguous, so the 2x2 windows are a plain view.
    n, c, h, w = x.shape
    nhwc = x.permute(0, 2, 3, 1).reshape(n, h // 2, 2, w // 2, 2, c)
    return nhwc.mean(dim=(2, 4)).permute(0, 3, 1, 2)


def timed(f, x, grad, repeats, device):
    def step():
        x.grad = None
        f(x).backward(grad)

    for _ in range(3):
        step()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            step()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    import time

    t = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - t) * 1e3 / repeats


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--repeats", type=int, default=50)
    a = p.parse_args()
    torch.manual_seed(0)
    for dtype in (torch.bfloat16, torch.float32):
        for shape in ((64, 64, 56, 56), (64, 128, 28, 28), (64, 256, 14, 14)):
            x = torch.randn(shape, device=a.device, dtype=dtype).contiguous(memory_format=torch.channels_last)
            x.requires_grad_(True)
            grad = torch.randn_like(by_pool(x))
            ya, yb = by_pool(x), by_view(x)
            (ga,) = torch.autograd.grad(ya, x, grad)
            (gb,) = torch.autograd.grad(yb, x, grad)
            tol = 1e-2 if dtype == torch.bfloat16 else 1e-6
            same = torch.allclose(ya.float(), yb.float(), atol=tol, rtol=tol) and torch.allclose(
                ga.float(), gb.float(), atol=tol, rtol=tol)
            t_pool = timed(by_pool, x, grad, a.repeats, a.device)
            t_view = timed(by_view, x, grad, a.repeats, a.device)
            print(f"{str(dtype):15} {str(shape):20} same={same} out_channels_last="
                  f"{yb.is_contiguous(memory_format=torch.channels_last)} avg_pool2d {t_pool:8.3f} ms  "
                  f"view-mean {t_view:8.3f} ms  ratio {t_pool / t_view:6.2f}", flush=True)


if __name__ == "__main__":
    main()
