"""Python side of bench/tabular_vs_fastai.cpp: fastai's TabularPandas + tabular_learner on the same CSV.

  tabular_fastai.py serve CSV EPOCHS BS   prints "ready", then for each line "fit" on stdin makes a new
                                         tabular_learner, runs fit_one_cycle(EPOCHS, 1e-2) and prints
                                         "<seconds> <rows trained> <valid accuracy>"

The setting, as the C++ side's: the census-like CSV of scripts/make-census-csv, categorical columns workclass,
education, occupation, native_country, sex; continuous age, hours_per_week, capital_gain, education_num;
target salary; procs Categorify, FillMissing, Normalize; RandomSplitter(0.2, seed 42); layers [200, 100];
batch size BS; Adam; 2 torch threads; no loader workers; no progress bar or logging.
"""
import sys
import time
import warnings

CATS = ["workclass", "education", "occupation", "native_country", "sex"]
CONTS = ["age", "hours_per_week", "capital_gain", "education_num"]


def serve(csv, epochs, bs):
    import pandas as pd
    import torch
    from fastai.tabular.all import (Categorify, CategoryBlock, FillMissing, Normalize, RandomSplitter, TabularPandas,
                                    accuracy, tabular_learner)

    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    df = pd.read_csv(csv, dtype={c: str for c in CATS + ["salary"]})
    splits = RandomSplitter(0.2, seed=42)(range(len(df)))
    to = TabularPandas(df, procs=[Categorify, FillMissing, Normalize], cat_names=list(CATS), cont_names=list(CONTS),
                       y_names="salary", y_block=CategoryBlock(), splits=splits)
    dls = to.dataloaders(bs=bs, num_workers=0)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "fit":
            continue
        learn = tabular_learner(dls, layers=[200, 100], metrics=accuracy)
        start = time.perf_counter()
        with learn.no_bar(), learn.no_logging():
            learn.fit_one_cycle(epochs, 1e-2)
        seconds = time.perf_counter() - start
        rows = epochs * len(dls.train) * bs  # full batches (drop_last)
        print(f"{seconds} {rows} {float(learn.recorder.values[-1][2])}", flush=True)


if __name__ == "__main__":
    serve(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
