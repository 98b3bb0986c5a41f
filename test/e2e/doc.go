// Package e2e runs the real rdzv binaries (from $RDZV_BIN_DIR) on a cluster
// of network-namespace hosts (test/netns) and trains examples/train.py with
// real torchrun and gloo across them. The tests need root; see `make e2e`.
package e2e
