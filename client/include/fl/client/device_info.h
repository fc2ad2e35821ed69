// What the client reports about the machine it runs on.
#pragma once

#include <string>

#include "fl/v1/common.pb.h"

namespace fl::client {

// Cores this process may use, physical memory, CPU architecture, OS and host name, read from the system.
// `device_class` is the operator's label ("rpi4", "gpu", ...); when empty it is guessed from the hardware
// ("rpi4"/"rpi5" from the device-tree model, otherwise the architecture).
fl::v1::DeviceInfo DetectDevice(const std::string& device_class);

}  // namespace fl::client
