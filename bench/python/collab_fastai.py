"""Python side of bench/collab_vs_fastai.cpp: fastai's CollabDataLoaders + collab_learner on the same ratings.

  collab_fastai.py serve CSV EPOCHS BS   prints "ready", then for each line "fit" on stdin makes a new
                                         collab_learner, runs fit_one_cycle(EPOCHS, 5e-3, wd=0.1) and prints
                                         "<seconds> <rows trained> <valid mse>"

The setting, as the C++ side's: the MovieLens-like CSV of scripts/make-ratings-csv (userId, movieId, rating);
CollabDataLoaders.from_df(valid_pct=0.2, seed=42, bs=BS); collab_learner(n_factors=50, y_range=(0, 5.5)) (fastai's
EmbeddingDotBias, MSELossFlat, Adam); 2 torch threads; no loader workers; no progress bar or logging.
"""
import sys
import time
import warnings


def serve(csv, epochs, bs):
    import pandas as pd
    import torch
    from fastai.collab import CollabDataLoaders, collab_learner

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    dls = CollabDataLoaders.from_df(pd.read_csv(csv), valid_pct=0.2, seed=42, bs=bs, num_workers=0)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "fit":
            continue
        learn = collab_learner(dls, n_factors=50, y_range=(0, 5.5))
        start = time.perf_counter()
        with learn.no_bar(), learn.no_logging():
            learn.fit_one_cycle(epochs, 5e-3, wd=0.1)
        seconds = time.perf_counter() - start
        rows = epochs * len(dls.train) * bs  # full batches (drop_last)
        print(f"{seconds} {rows} {float(learn.recorder.values[-1][1])}", flush=True)


if __name__ == "__main__":
    serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
