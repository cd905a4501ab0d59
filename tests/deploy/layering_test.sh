#!/bin/bash
# Every #include "..." in server/ follows the daemon's layers: a file of one layer includes
# only headers of the layers it may use. The layers are declared once, in server/CMakeLists.txt
# (FERRY_SERVER_LAYERS), and passed here as its rows, "layer:dep,dep", lowest first; a layer
# is a folder of server/, but for "daemon", server/'s own files. A layer may use itself, its
# dependencies, and what they may use. Each include is resolved the way the compiler does
# (next to the including file first, then from server/); one that resolves outside server/
# (ferry/status.h, the generated protocol headers) is not a layer's and is not checked.
#   layering_test.sh SERVER_DIR ROW...
set -uo pipefail
server=$1
shift
cd "$server" || exit 1

declare -A deps allowed
layers=()
for row in "$@"; do
  if [[ ! $row =~ ^([a-z]+):([a-z,]*)$ ]]; then
    echo "a layer row is \"layer:dep,dep\", not \"$row\""
    exit 1
  fi
  layer=${BASH_REMATCH[1]}
  deps[$layer]=${BASH_REMATCH[2]//,/ }
  layers+=("$layer")
  # Rows come lowest first, so every dependency's own set is known already.
  set=" $layer "
  for dep in ${deps[$layer]}; do
    if [[ -z ${allowed[$dep]+x} ]]; then
      echo "layer $layer uses $dep, which is not a layer below it"
      exit 1
    fi
    for l in ${allowed[$dep]}; do
      [[ $set == *" $l "* ]] || set+="$l "
    done
  done
  allowed[$layer]=$set
done

# The layer of a path relative to server/ ("" when it is in none).
layer_of() {
  local path=$1 top
  if [[ $path != */* ]]; then
    top=daemon
  else
    top=${path%%/*}
    [[ $top == daemon ]] && top=""
  fi
  [[ -n ${allowed[$top]+x} ]] && echo "$top"
}

bad=0
includes=0
files=0
while IFS= read -r -d '' file; do
  file=${file#./}
  ((files++))
  from=$(layer_of "$file")
  if [[ -z $from ]]; then
    echo "server/$file: in no layer (add its folder to FERRY_SERVER_LAYERS in server/CMakeLists.txt)"
    bad=1
    continue
  fi
  dir=$(dirname "$file")
  n=0
  while IFS= read -r line; do
    ((n++))
    [[ $line =~ ^[[:space:]]*#[[:space:]]*include[[:space:]]*\"([^\"]+)\" ]] || continue
    inc=${BASH_REMATCH[1]}
    if [[ -e $dir/$inc ]]; then
      target=$(realpath -m --relative-to=. "$dir/$inc")
    elif [[ -e $inc ]]; then
      target=$(realpath -m --relative-to=. "$inc")
    else
      continue  # not in server/
    fi
    [[ $target == ../* ]] && continue
    ((includes++))
    to=$(layer_of "$target")
    if [[ -z $to ]]; then
      echo "server/$file:$n: includes server/$target, which is in no layer"
      bad=1
    elif [[ ${allowed[$from]} != *" $to "* ]]; then
      uses=${allowed[$from]# }
      echo "server/$file:$n: $from may not include \"$inc\" ($to); $from may use: ${uses% }"
      bad=1
    fi
  done <"$file"
done < <(find . -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0)

if ((bad)); then
  echo "layers (server/CMakeLists.txt, FERRY_SERVER_LAYERS): $*"
  exit 1
fi
echo "$includes includes of server/ in $files files follow the layers: $*"
