#!/bin/bash
# Every C++ and CUDA source follows .clang-format (the house style). Exit 77 (skipped) where
# clang-format is not installed; deploy/install-deps.sh installs it.
#   format_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
if ! command -v clang-format >/dev/null; then
  echo "SKIP: clang-format not found (deploy/install-deps.sh installs it)"
  exit 77
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null ||
                     find server client common bench tests -name '*.cc' -o -name '*.h' -o -name '*.cu')
bad=()
for f in "${files[@]}"; do
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  echo "not formatted with .clang-format (run: clang-format -i FILE):"
  printf '  %s\n' "${bad[@]}"
  exit 1
fi
echo "${#files[@]} sources follow .clang-format"
