#!/usr/bin/env bash
# Fails if a target the models build on is networking code: the control or
# data plane (gRPC, ZeroMQ, protobuf, the wire formats, the cluster and
# data-plane clients, the SDK, the daemons). $1: the genquery's output, one
# label per line.
set -euo pipefail
deps="$1"
pattern='^//(client|cluster|proto|scheduler|server|transport|worker|lbfgs)[:/]'
pattern+='|^//third_party/system:(grpc|protobuf|zmq)$'
if bad=$(grep -E "$pattern" "$deps"); then
  echo "models/ must do no networking, but it depends on:"
  echo "$bad"
  exit 1
fi
echo "models/ builds on $(wc -l <"$deps") targets, none of them networking"
