#pragma once

#include <memory>
#include <string>

#include "process_group/store.h"

namespace drpc {

// A view of `base` in which every key is "<prefix>/<key>", so several groups can share
// one store without colliding. `base` is borrowed and must outlive the view.
std::unique_ptr<Store> create_prefix_store(std::string prefix, Store& base);

}  // namespace drpc
