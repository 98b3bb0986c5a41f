// Package sim runs the real rdzv-controller binary (embedded etcd, mutual
// TLS) against many simulated agents in the calling process, each with its
// own gRPC connection, source address on 127.0.0.0/8 and agent
// certificate, speaking the agent protocol (see agent.go for what the
// simulation shares with the real agent). It is for tests and benchmarks
// only: test/e2e's controller crash test and test/bench/scale.
package sim
