"""Oracle for fastlearn's tabular preprocessing: what fastai's Categorify, FillMissing and Normalize fit.

usage: tabular_procs_oracle.py CSV OUT.json --cat a,b,c --cont x,y --y TARGET
                               [--valid-idx-file FILE | --valid-pct 0.2 --seed 42]
                               [--y-block auto|category|regression] [--head 5]

Reads CSV with pandas the way fastai users do (default NA handling: empty cells, and pandas' default NA
strings, are NaN; the --cat columns, and the target unless it is a regression target, are read as strings
so that digit-only levels stay text), builds
TabularPandas(df, procs=[Categorify, FillMissing, Normalize], cat_names, cont_names, y_names, y_block, splits)
and writes OUT.json with what was fitted on the training rows and a few processed rows (see write_json).
--valid-idx-file holds one 0-based data-row index per line (the split both sides share; the training rows
are then the other rows in file order); without it the split is fastai's RandomSplitter(valid_pct, seed).

What fastai 2.8 does (read from fastai/tabular/core.py, fastai/data/transforms.py; checked by running it):
  * Before anything else TabularPandas copies the frame and, with its default reduce_memory=True, shrinks
    dtypes over the WHOLE frame (train and valid rows together): string/object columns become pandas
    'category' columns, integer columns the smallest int type that holds them, float columns float32 when
    their range fits (a continuous column with empty cells reads as float64, so it becomes float32). Bool
    columns are left alone. Then the rows are reordered: training rows in split order, then valid rows.
  * Procs run by their `order`, not by list position: FillMissing (0), then Categorify and the target's
    Categorize (1), then Normalize (99). Each is fitted on the training rows only, then applied to all rows.
  * FillMissing (defaults: strategy median, add_col=True): only continuous columns with at least one NaN
    among the TRAINING rows get a fill value, the median of their non-missing training values (computed by
    pandas on the float32 column). NaNs in every row are replaced by it and, for each such column in
    cont_names order, a bool column `<col>_na` (True where the cell was missing) is added and appended to
    cat_names, so Categorify encodes it too. A column with NaNs only in valid rows fails fastai's assertion
    "nan values in `<col>` but not in setup training set". (Other strategies: mode, constant fill_vals
    which default to 0.)
  * Categorify: vocab = ['#na#'] + levels. For a category column (every string column, after the shrink)
    the levels are the pandas categories of the whole column: the distinct non-missing values sorted by
    code point (case-sensitive, 'Z' < 'a', '10th' < '1st-4th'), INCLUDING levels that occur only in valid
    rows. For a non-category column (the bool `_na` columns, or anything with reduce_memory=False) they are
    the distinct non-missing training values, sorted: an `_na` vocab is ['#na#', False, True]. A value's
    code is its index in the vocab; missing (and unknown) values get 0, i.e. '#na#'.
  * Target with CategoryBlock (Categorize on a category column, strict): vocab = the target's levels that
    occur in the training rows, sorted by code point, no '#na#'; codes 0..n-1.
  * Normalize: over cont_names only (never the `_na` columns), after filling, on training rows:
    mean = pandas mean; std = pandas std with ddof=0 (population std), plus eps 1e-7 added to the std (not
    to the variance); x' = (x - mean) / std. fastai stores the std WITH the eps added, as written below.
    Float columns were shrunk to float32, so these can differ from float64 statistics of the same numbers
    (seen: under 1e-7 relative); a relative tolerance of 1e-6 allows that and still catches ddof=1, which
    is off by about 1/(2n) (2e-5 for 24000 training rows).
"""
import argparse
import json
import sys
import warnings

import numpy as np
import pandas as pd


def plain(value):
    """numpy scalars to JSON-ready Python values."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return str(value)


def rows(to_part, limit, cat_names, cont_names, y_name, categorical_y):
    items = to_part.items.iloc[:limit]
    return {
        "row_idx": [int(i) for i in items.index],
        "cats": [[int(v) for v in r] for r in items[cat_names].to_numpy()],
        "conts": [[float(v) for v in r] for r in items[cont_names].to_numpy(dtype=np.float64)],
        "y": [int(v) if categorical_y else float(v) for v in items[y_name].to_numpy()],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("out")
    parser.add_argument("--cat", required=True, help="comma-separated categorical columns")
    parser.add_argument("--cont", required=True, help="comma-separated continuous columns")
    parser.add_argument("--y", required=True, help="target column")
    parser.add_argument("--valid-idx-file")
    parser.add_argument("--valid-pct", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--y-block", choices=["auto", "category", "regression"], default="auto",
                        help="auto: regression if pandas reads the target as numbers, else category")
    parser.add_argument("--head", type=int, default=5, help="processed rows to write from each split")
    args = parser.parse_args()
    cat_names = [c for c in args.cat.split(",") if c]
    cont_names = [c for c in args.cont.split(",") if c]

    warnings.filterwarnings("ignore")  # fastai's import-time and pandas deprecation chatter
    import fastai
    from fastai.tabular.core import Categorify, FillMissing, TabularPandas, df_shrink_dtypes
    from fastai.data.block import CategoryBlock, RegressionBlock
    from fastai.data.transforms import Normalize, RandomSplitter

    y_block = args.y_block
    if y_block == "auto":
        probe = pd.read_csv(args.csv, usecols=[args.y])
        y_block = "regression" if pd.api.types.is_numeric_dtype(probe[args.y]) else "category"
    categorical_y = y_block == "category"
    text_cols = cat_names + ([args.y] if categorical_y else [])
    df = pd.read_csv(args.csv, dtype={c: str for c in text_cols})

    if args.valid_idx_file:
        with open(args.valid_idx_file) as f:
            valid = [int(line) for line in f if line.strip()]
        chosen = set(valid)
        if len(chosen) != len(valid) or any(not 0 <= i < len(df) for i in valid):
            parser.error("--valid-idx-file: indices must be distinct and in [0, rows)")
        train = [i for i in range(len(df)) if i not in chosen]
    else:
        train, valid = RandomSplitter(args.valid_pct, seed=args.seed)(range(len(df)))
        train, valid = [int(i) for i in train], [int(i) for i in valid]

    shrunk = df_shrink_dtypes(df[cat_names + cont_names + [args.y]])
    # Copies: fastai appends the `_na` columns to the very list it is given.
    to = TabularPandas(df, procs=[Categorify, FillMissing, Normalize], cat_names=list(cat_names),
                       cont_names=list(cont_names), y_names=args.y,
                       y_block=CategoryBlock() if categorical_y else RegressionBlock(), splits=(train, valid))
    procs = to.procs
    fill, categorify, normalize = procs.fill_missing, procs.categorify, procs.normalize
    final_cats = list(to.cat_names)
    na_cols = [c for c in final_cats if c not in cat_names]

    result = {
        "fastai_version": fastai.__version__,
        "pandas_version": pd.__version__,
        "csv": args.csv,
        "n_rows": len(df),
        "proc_order": [type(p).__name__ for p in procs.fs],
        "cat_names": final_cats,            # the --cat columns, then the added `_na` columns
        "cont_names": list(to.cont_names),
        "y_name": args.y,
        "y_block": y_block,
        "dtypes_seen": {c: str(shrunk.get(c, df[c].dtype)) for c in cat_names + cont_names + [args.y]},
        "categorify": {c: [plain(v) for v in categorify[c]] for c in final_cats},
        "fill_missing": {
            "strategy": str(fill.fill_strategy),
            "add_col": bool(fill.add_col),
            "fill_values": {c: plain(v) for c, v in fill.na_dict.items()},
            "na_columns": na_cols,
        },
        "normalize": {
            "ddof": 0,
            "eps": 1e-7,
            "means": {c: plain(normalize.means[c]) for c in cont_names},
            "stds": {c: plain(normalize.stds[c]) for c in cont_names},  # eps already added
        },
        "y_vocab": [plain(v) for v in procs.categorize.vocab] if categorical_y else None,
        "split": {"train_idx": train, "valid_idx": valid},
        "train_head": rows(to.train, args.head, final_cats, list(to.cont_names), args.y, categorical_y),
        "valid_head": rows(to.valid, args.head, final_cats, list(to.cont_names), args.y, categorical_y),
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{args.out}: {len(train)} train / {len(valid)} valid rows, cats {final_cats}, "
          f"filled {list(fill.na_dict)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
