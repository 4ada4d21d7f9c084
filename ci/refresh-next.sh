#!/usr/bin/env bash
# Moves CI's "next" leg to the newest nightlies on PyPI: rewrites the pins in
# ci/constraints-next.txt and the pair in mirrorkit/versions.py (NEXT). Run from anywhere:
#   bash ci/refresh-next.sh
# then run the leg (docs/versions.md, "The next Keras and TensorFlow") before committing.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" tf-nightly-cpu keras-nightly tb-nightly
version() {  # version DISTRIBUTION: the version of the wheel pip just downloaded
  basename "$tmp/$1"-*.whl | cut -d- -f2
}
tf=$(version tf_nightly_cpu)
keras=$(version keras_nightly)
tb=$(version tb_nightly)
sed -i -E "s/^tf-nightly-cpu==.*/tf-nightly-cpu==$tf/; s/^keras-nightly==.*/keras-nightly==$keras/;\
 s/^tb-nightly==.*/tb-nightly==$tb/" ci/constraints-next.txt
sed -i -E "s/^NEXT = \(.*\)$/NEXT = (\"$tf\", \"$keras\")/" mirrorkit/versions.py
echo "next leg: tf-nightly-cpu $tf, keras-nightly $keras, tb-nightly $tb"
git --no-pager diff --stat -- ci/constraints-next.txt mirrorkit/versions.py
