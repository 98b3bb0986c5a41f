// Package scale measures the controller at cluster scale: the real
// rdzv-controller binary (embedded etcd, mutual TLS) and N simulated
// agents in this process (package test/sim), each with its own gRPC
// connection, source address on 127.0.0.0/8 and agent certificate,
// speaking the agent protocol (see test/sim/agent.go for what the
// simulation shares with the real agent). For each N it times the phases
// register (a cold controller and all agents connecting at once), steady (heartbeats only: round trips,
// the controller's CPU, memory, goroutines), rendezvous (one job over all
// N nodes), recovery (one node of that job goes silent) and restart (the
// controller SIGKILLed and started again on its data directory, every
// agent reconnecting at once), and prints the figures. Nothing in it is a timed assertion; each phase has a generous
// cap only so that a hang ends the run. It is not part of `make test`.
//
// Run it with `make bench-scale` (root is not needed, but the open-file
// limit must allow N connections in this process and in the controller).
//
// Environment:
//
//	RDZV_BIN_DIR   directory of rdzv-controller (required; make sets it)
//	BENCH_NODES    comma-separated cluster sizes (default 1000), e.g. 1000,5000,10000
//	BENCH_STEADY   length of the steady window (default 30s)
//	BENCH_PKI_DIR  certificate cache (default $TMPDIR/rdzv-bench-scale-pki)
//	BENCH_LOG_DIR  keep each size's controller log, data, profiles and etcd-txns.tsv
//	               (every etcd transaction seen: time, revision, keys, first key) here
//	BENCH_PROFILE  1: take a CPU profile of the controller in each phase
//	               (its socket, --pprof-socket), and of relay 0 in the
//	               steady phase, and print their top entries
//	BENCH_OUT      also write the report to this file
//	BENCH_CONTROLLER_CONFIG  the controller's --config (YAML; the bench's own
//	               flags override it), e.g. to compare tls.max_handshakes
//	BENCH_CONTROLLER_ENV  KEY=VALUE pairs, space-separated, added to the
//	               controller's environment alone, e.g. GOGC=50
//	BENCH_SIM_GC   phases (default): this process, which carries every
//	               simulated agent, collects its garbage before the steady
//	               window and not again until the size's phases end, as
//	               no real cluster stalls all its agents at once; go: Go's
//	               default (see gc_test.go)
//	BENCH_RELAYS   run this many real rdzv-relay processes (default 0: none),
//	               agent i connecting through relay i mod BENCH_RELAYS, as
//	               racks would; their CPU is reported apart
//
// The benchmark is built only with the bench build tag:
//
//	go test -tags bench -run TestBenchScale -v ./test/bench/scale/
package scale
