// KeepFreedMemory: the setting is applied (an 8 MiB block is heap memory and stays after free, where glibc's
// defaults would mmap and unmap it), and a refused setting is named. Its own process (one test binary per file),
// so no earlier free has raised glibc's dynamic mmap threshold.
#include "fl/core/allocator.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace fl::core {
namespace {

// Keeps the compiler from eliding a malloc/free pair.
void* volatile g_block = nullptr;

TEST(KeepFreedMemoryTest, LargeBlocksComeFromTheHeapAndStayThereAfterFree) {
  ASSERT_TRUE(KeepFreedMemory().ok());
  // 8 MiB: with glibc's default (128 KiB, or a dynamic threshold no larger block has raised yet in this
  // process) this is its own mmap, unmapped at free; with the setting it is heap memory, kept after free.
  constexpr size_t kBytes = size_t{8} << 20;
  const struct mallinfo2 before = mallinfo2();
  g_block = std::malloc(kBytes);
  ASSERT_NE(g_block, nullptr);
  std::memset(g_block, 1, kBytes);
  const struct mallinfo2 allocated = mallinfo2();
  EXPECT_EQ(allocated.hblks, before.hblks) << "the 8 MiB block was mmapped: M_MMAP_THRESHOLD not applied";
  EXPECT_GE(allocated.arena, before.arena + kBytes - (size_t{1} << 20));
  std::free(g_block);
  g_block = nullptr;
  const struct mallinfo2 freed = mallinfo2();
  // Trimmed at the default 128 KiB M_TRIM_THRESHOLD; kept below 1 GiB.
  EXPECT_EQ(freed.arena, allocated.arena) << "the heap was trimmed after free: M_TRIM_THRESHOLD not applied";
  EXPECT_GE(freed.fordblks, kBytes);
}

TEST(KeepFreedMemoryTest, AThresholdMalloptCannotTakeIsNamed) {
  const absl::Status st = KeepFreedMemory(kKeepMmapThreshold, size_t{1} << 40);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find("trim 1099511627776"), std::string::npos) << st.message();
  ASSERT_TRUE(KeepFreedMemory().ok());
}

}  // namespace
}  // namespace fl::core
