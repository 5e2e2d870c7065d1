// merge_runs.h: puts a sequence made of a few ordered runs in order.
//
// A worker's transmit queue after recirculation is a handful of runs, each
// already in arrival order (what the first pass sent, what conntrack resumed,
// what the next pass sent): merging the runs pairwise through a scratch
// buffer costs O(n log runs) and allocates nothing once the buffers have
// grown, where a sort would cost O(n log n). `less` must be a strict total
// order (no two elements equal), as (arrival, emission) is.
// Header-only; the caller owns the buffers (one thread).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dpu {

template <class T, class Less>
void merge_runs(std::vector<T>& v, std::vector<T>& scratch, std::vector<uint32_t>& runs, Less less) {
  const uint32_t n = static_cast<uint32_t>(v.size());
  runs.clear();
  runs.push_back(0);
  for (uint32_t i = 1; i < n; i++)
    if (less(v[i], v[i - 1])) runs.push_back(i);
  if (runs.size() == 1) return;  // already in order
  runs.push_back(n);             // runs[k]..runs[k+1] is run k
  if (scratch.size() < n) scratch.resize(n);
  T* src = v.data();
  T* dst = scratch.data();
  while (runs.size() > 2) {
    size_t out = 0, i = 0;
    for (; i + 2 < runs.size(); i += 2) {
      std::merge(src + runs[i], src + runs[i + 1], src + runs[i + 1], src + runs[i + 2], dst + runs[i], less);
      runs[out++] = runs[i];
    }
    if (i + 1 < runs.size()) {  // an odd run out
      std::copy(src + runs[i], src + runs[i + 1], dst + runs[i]);
      runs[out++] = runs[i];
    }
    runs[out++] = n;
    runs.resize(out);
    std::swap(src, dst);
  }
  if (src != v.data()) std::copy(src, src + n, v.data());
}

}  // namespace dpu
