#include "worker/bsp_parts.h"

namespace downpour {

std::vector<BspPart> CutBspParts(const std::vector<ParamBlock>& blocks) {
  std::vector<BspPart> parts;
  size_t offset = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const size_t rows = blocks[i].rows, width = blocks[i].width;
    const size_t step =
        std::max<size_t>(1, kBspPartBytes / (width * sizeof(float)));
    for (size_t r = 0; r < rows; r += step) {
      const size_t e = std::min(rows, r + step);
      parts.push_back({i, r, e, offset + r * width, (e - r) * width});
    }
    offset += rows * width;
  }
  return parts;
}

}  // namespace downpour
