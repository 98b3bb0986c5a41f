// Package bench measures how long a training job takes to recover from a
// fault under rdzv, torchrun's own elastic mode, NVIDIA's ft_launcher
// (nvidia-resiliency-ext) and torchft, side by side, on network-namespace
// hosts (test/netns), and the goodput of each under a fault a minute. Run it with `make bench-recovery`
// (root, the built binaries, /usr/bin/torchrun). It prints figures; nothing
// in it is a timed assertion, and it is not part of `make test`. Each run
// also prints where its recovery's time went: the phases from the
// controller's events (detect, stopped, commit, launched) and from the
// workers' PHASE lines (python, torch, pg, step), with their medians in a
// table.
//
// Environment:
//
//	RDZV_BIN_DIR    directory of rdzv-controller, rdzv-agent, rdzvctl (required)
//	BENCH_RUNS      runs per fault and system (default 1, make sets 3); the table shows medians
//	BENCH_CAP       how long to wait for recovery before reporting none (default 120s)
//	BENCH_FAULTS    comma-separated subset of kill-worker,kill-node,cut-link,hang
//	                (also the goodput run's rotation); none: the goodput run only
//	BENCH_SYSTEMS   comma-separated subset of rdzv,rdzv-warm,rdzv-mem,torchrun,nvrx,torchft
//	                (rdzv: launcher.kind torchrun; rdzv-warm: launcher.kind warm,
//	                standby workers, what a script job gets by default; rdzv-mem:
//	                rdzv-warm with an in-memory checkpoint every step; nvrx: ft_launcher; torchft: lighthouse and Manager,
//	                test/bench/bench_torchft.py; settings in launchers_test.go)
//	BENCH_VENV      the venv with torch and the peers (python/requirements/peers.txt;
//	                default the checkout's .venv)
//	BENCH_TORCH     venv (default): every system runs BENCH_VENV's torchrun and
//	                Python; system: rdzv and torchrun elastic run Debian's
//	                python3-torch (1.13), the peers (torch >= 2.7) still the venv's
//	BENCH_GOODPUT   the goodput run's length (default 10m; 0: none): a fault every
//	                60s rotating through the kinds; BENCH_GOODPUT_BASELINE the
//	                fault-free run it is compared with (default the shorter of
//	                BENCH_GOODPUT and 2m)
//	BENCH_GOODPUT_PAIRED  1: the goodput run is its own baseline: after its
//	                first 30s, a minute that starts with a fault and a minute
//	                without, in turn (BENCH_GOODPUT=16m30s holds 8 such pairs,
//	                2 of each kind); goodput is the mean over the fault kinds
//	                of their minutes' useful steps over those of the fault-free
//	                minute after each, and no separate baseline run is made
//	BENCH_STATE_MB  extra state in every checkpoint, MB (default 0; 1024 for the
//	                large-state workload, so a checkpoint's load shows), and in
//	                torchft's replica state, which a rejoining group heals from
//	                a live peer
//	BENCH_OUT       also write the report to this file
//	BENCH_TORCHRUN_RDZV_CONF  pass --rdzv_conf=VALUE to the torchrun baseline, e.g.
//	                last_call_timeout=1 (the baseline uses torchrun's defaults)
//	BENCH_LOG_DIR   keep every run's logs, ticks and checkpoints here instead
//	                of in temporary directories
//
// TestBenchSoak (`make bench-soak`) measures the failure detector's false
// positives instead: a long job on three hosts, one of them starved of CPU
// (every process of it and two busy loops in one cgroup with a CPU quota,
// optionally with netem delay on its link), no fault injected, counting
// nodes declared lost, failed attempts, restarts and peers' "unreachable"
// reports, with the starvation's evidence beside them (step rates,
// heartbeat ages, a probe's wake-up delay, the cgroup's throttling). Any
// loss or failed attempt fails it. Its environment:
//
//	SOAK_DURATION     how long the host is saturated (default 10m), after 45s unsaturated
//	SOAK_CPU_PERCENT  the host's quota, percent of one CPU (default 10)
//	SOAK_NETEM        false: no delay phase; true: require one (unset: where the
//	                  kernel has sch_netem, the second half adds 100ms ± 50ms delay)
//	BENCH_OUT, BENCH_LOG_DIR as above
//
// TestBenchHostile (`make bench-hostile`) runs hostile peers (package
// test/hostile) against the real controller and relay on loopback, each for
// HOSTILE_DURATION (default 30s; HOSTILE_CONNS sets the connection attack's
// count, default 1,000), and prints each daemon's memory and the real
// agents' heartbeat latency during each. It needs neither root nor torch.
//
// The benchmarks are built only with the bench build tag:
//
//	go test -tags bench -run TestBenchRecovery -v ./test/bench/
//	go test -tags bench -run TestBenchSoak -v ./test/bench/
//	go test -tags bench -run TestBenchHostile -v ./test/bench/
package bench
