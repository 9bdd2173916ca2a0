#pragma once
// What every training command does with its config: reads it (the devices checked for this host's ranks), builds
// the Learner of a saved checkpoint, and says results in words.
#include "cli/commands.h"

#include <fastlearn/config/train_config.h>
#include <fastlearn/data/csv.h>
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fastlearn::cli {

/// The config of args.config_path with args.sets applied, data.y_block decided from the data, train.device and
/// distributed.backend checked against this host's GPUs; throws before anything is written.
TrainConfig read_config_file(const TrainArgs& args);

/// The config's Learner (without a run's callbacks) with the checkpoint's weights, for validate, interpret and
/// predict (`command`); loading also checks the saved class names and tabular procs against the data's.
std::unique_ptr<Learner> learner_from_checkpoint(const TrainConfig& config, const std::string& out,
                                                 const std::string& checkpoint, const char* command);

/// The columns of `table` (read from `file`) that `learn`'s table model reads, by name, with their index; DataError
/// naming the file and the columns when one is absent (an empty cell is a missing value; an absent column a mistake).
std::map<std::string, std::size_t> input_columns(Learner& learn, const CsvTable& table, const std::string& file);

/// The image files a predict input names: the file itself, or every image under a folder (get_image_files); DataError
/// naming the input when it is neither, or a folder without an image.
std::vector<std::filesystem::path> image_files_of(const std::string& input);

/// One line of a CSV file (with its newline): the cells joined by commas, a cell quoted when it holds a comma, a quote
/// or a line break (its quotes doubled).
std::string csv_line(const std::vector<std::string>& cells);

/// "loss 0.3124, accuracy 89.20%": percentages for the metrics that are fractions of items.
std::string describe(const ValidationResult& result);

/// Whether this process is one rank of a launched job (RANK is set).
bool under_launcher();

}  // namespace fastlearn::cli
