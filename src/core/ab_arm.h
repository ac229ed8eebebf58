// The arm of an in-process A/B measurement (`bench model --ab`): 0 (A) or 1 (B), switched between
// decode steps, so that both arms see the same minutes of a machine whose speed moves 15-50%
// between runs. Code under experiment chooses by ab_arm() (a throwaway edit: committed code never
// reads it, so the two arms of a committed build are the same code, an A/A control of the spread).
#pragma once
#include <atomic>
#include <cstdint>

namespace ft {

inline std::atomic<int> g_ab_arm{0};
inline int ab_arm() { return g_ab_arm.load(std::memory_order_relaxed); }

// Arm of decode step `step` in repetition `rep`: A B B A A B B A ..., the pattern inverted every
// other repetition, so that neither arm always runs first or after the other.
inline int ab_arm_of(int64_t step, int rep) { return int(((step ^ (step >> 1)) & 1) ^ (rep & 1)); }

}  // namespace ft
