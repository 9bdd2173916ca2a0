"""Oracle for fastlearn's collaborative filtering: fastai's CollabDataLoaders and collab_learner.

usage: fastai_collab_oracle.py make DIR
       fastai_collab_oracle.py predict DIR WEIGHTS.safetensors OUT.json {dot|nn}

make: writes DIR/ratings.csv (integer users and items, ratings 1-5 from planted factors; a few users and items
occur only in rows that the split puts in validation), builds CollabDataLoaders.from_df(df, valid_pct=0.2, seed=42,
bs=64) and two learners, collab_learner(dls, n_factors=5, y_range=(0, 5.5)) (EmbeddingDotBias) and
collab_learner(dls, use_nn=True, layers=[20], y_range=(0, 5.5)) (EmbeddingNN), each trained by fit_one_cycle(1, 5e-3)
so that the weights are not their initial draws; saves their state dicts (DIR/dot.safetensors, DIR/nn.safetensors)
and DIR/fastai.json: the split (data-row indices in fastai's order), the vocabularies as text, and each model's
predictions on the validation rows in that order (eval mode, through get_preds).

predict: loads WEIGHTS into the same fastai model (dot or nn, built over the same dls) with load_state_dict(strict)
and writes its predictions on the validation rows, in the order of fastai.json, to OUT.json.

What fastai 2.8 does (read from fastai/collab.py, fastai/tabular/core.py; checked by running it): from_df takes the
first three columns as user, item and rating; TabularCollab([Categorify]) with cat_names [user, item], y the rating
(TransformBlock: as it is), with_cont False, so batches are (codes (N, 2),) and the target; Categorify fits each column
on the training rows (integer columns are not pandas categories, so a user seen only in validation rows is '#na#',
code 0); the split is RandomSplitter(valid_pct, seed): torch.randperm after torch.manual_seed(seed).
"""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from fastai.collab import CollabDataLoaders, collab_learner
from safetensors.torch import load_file, save_file


def ratings(path):
    rng = np.random.default_rng(7)
    users, items, rows = 40, 60, 700
    u = rng.normal(size=(users, 3))
    i = rng.normal(size=(items, 3))
    user = rng.integers(0, users, rows)
    item = rng.integers(0, items, rows)
    value = 3 + (u[user] * i[item]).sum(1) + 0.3 * rng.normal(size=rows)
    df = pd.DataFrame({"userId": user + 1, "movieId": item + 1001, "rating": np.clip(np.rint(value), 1, 5).astype(int)})
    # Users and items of one rating each: those the split sends to validation are unknown there ('#na#').
    once = pd.DataFrame({"userId": np.arange(41, 56), "movieId": np.arange(1061, 1076), "rating": 3})
    df = pd.concat([df, once], ignore_index=True)
    df.to_csv(path, index=False)
    return df


def learners(dls):
    torch.manual_seed(0)
    dot = collab_learner(dls, n_factors=5, y_range=(0, 5.5))
    torch.manual_seed(1)
    nn = collab_learner(dls, use_nn=True, layers=[20], y_range=(0, 5.5))
    return {"dot": dot, "nn": nn}


def dataloaders(df):
    return CollabDataLoaders.from_df(df, valid_pct=0.2, seed=42, bs=64)


def valid_preds(learn):
    with learn.no_bar():
        preds, _ = learn.get_preds(ds_idx=1)
    return preds.flatten().double().tolist()


def make(out):
    out.mkdir(parents=True, exist_ok=True)
    df = ratings(out / "ratings.csv")
    dls = dataloaders(pd.read_csv(out / "ratings.csv"))
    result = {
        "train_idx": [int(x) for x in dls.train.items.index],
        "valid_idx": [int(x) for x in dls.valid.items.index],
        "users": [str(x) for x in dls.classes["userId"]],
        "items": [str(x) for x in dls.classes["movieId"]],
    }
    for name, learn in learners(dls).items():
        with learn.no_bar(), learn.no_logging():
            learn.fit_one_cycle(1, 5e-3)
        save_file({k: v.contiguous() for k, v in learn.model.state_dict().items()}, str(out / f"{name}.safetensors"))
        result[f"{name}_preds"] = valid_preds(learn)
    assert len(df) == len(result["train_idx"]) + len(result["valid_idx"])
    (out / "fastai.json").write_text(json.dumps(result))


def predict(out, weights, target, kind):
    dls = dataloaders(pd.read_csv(out / "ratings.csv"))
    learn = learners(dls)[kind]
    learn.model.load_state_dict(load_file(str(weights)), strict=True)
    Path(target).write_text(json.dumps({"preds": valid_preds(learn)}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        predict(Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
