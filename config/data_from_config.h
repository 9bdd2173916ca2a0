#pragma once
// The training and validation data a config's [data] table describes, as DataLoaders: Fashion-MNIST (or a
// local MNIST-format folder), the user's image files (class folders or a CSV table), a CSV table of rows, or
// a seeded synthetic regression, or (dataset = "program") loaders without items that describe the samples a running
// program hands over. Under a launcher, the download happens once per host (rank0_first).
#include <fastlearn/config/train_config.h>
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/tabular_dataloaders.h>

namespace fastlearn {

/// The DataLoaders of `config` (data.*, and train.seed for the split and the shuffles). DataError for data that
/// cannot be read, ConfigError for a data.dataset this build does not know.
DataLoaders dataloaders_from_config(const TrainConfig& config);

/// The TabularOptions of a config with data.dataset = "csv"; data.y_block empty (not decided yet) leaves
/// regression to the data.
TabularOptions tabular_options(const TrainConfig& config);

}  // namespace fastlearn
