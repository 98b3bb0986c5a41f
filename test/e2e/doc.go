// Package e2e runs the real rdzv binaries (from $RDZV_BIN_DIR) on a cluster
// of network-namespace hosts (test/netns) and trains examples/train.py with
// real torchrun and gloo across them. The tests need root; see `make e2e`.
// TestControllerCrashMidRecovery needs neither root nor torch: it runs the
// real controller against 1,000 simulated agents (test/sim) and kills it
// during a recovery. Nor does TestHostilePeers: hostile peers (test/hostile)
// against the real controller and relay on loopback, checking both
// daemons' memory bounds.
package e2e
