// Command rdzv-agent runs on every GPU node.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rdzv/rdzv/agent"
	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/gpu/nvmlgpu"
	"github.com/rdzv/rdzv/agent/netif"
	"github.com/rdzv/rdzv/cmd/internal/cli"
	"github.com/rdzv/rdzv/wire"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "shim" {
		shim(os.Args[2:])
		return
	}
	cfg, _, err := config(os.Args[1:])
	if errors.Is(err, cli.ErrExit) {
		return
	}
	if err != nil {
		cli.Fatal("rdzv-agent", err)
	}
	log, err := cli.NewLogger(cfg.LogLevel)
	if err != nil {
		cli.Fatal("rdzv-agent", err)
	}
	nvml := nvmlgpu.NewSystem(log.Named("nvml"))
	var gpus agent.GPUDiscoverer = nvml
	opts := []agent.Option{agent.WithGPUHealth(nvml)}
	if cfg.FakeGPUs > 0 {
		gpus, opts = gpu.Fake{Count: cfg.FakeGPUs, Node: cfg.NodeName}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		cli.Fatal("rdzv-agent", fmt.Errorf("finding the agent binary, which runs the worker shims: %w", err))
	}
	spawner := agent.ShimSpawner{Dir: agent.ShimsDir(cfg.StateDir), Command: []string{exe, "shim"}, Log: log.Named("shim"),
		Leases: &agent.Leases{}}
	a, err := agent.New(cfg, log.Named("agent"), gpus, &netif.SystemDetector{}, spawner, opts...)
	if err != nil {
		cli.Fatal("rdzv-agent", err)
	}
	cli.RunDaemon("rdzv-agent", log, a)
}

// shim runs one worker's shim (see agent.Shim); the agent starts it.
func shim(args []string) {
	fs := flag.NewFlagSet("rdzv-agent shim", flag.ContinueOnError)
	dir := fs.String("dir", "", "the shim's directory, prepared by the agent")
	if err := fs.Parse(args); err != nil {
		cli.Fatal("rdzv-agent shim", err)
	}
	if *dir == "" {
		cli.Fatal("rdzv-agent shim", errors.New("--dir is required"))
	}
	log, err := cli.NewLogger("info")
	if err != nil {
		cli.Fatal("rdzv-agent shim", err)
	}
	cli.RunDaemon("rdzv-agent shim", log, agent.Shim{Dir: *dir, Ready: os.Stdout, Spawner: os.Stdin, Log: log.Named("shim"), Subreaper: true})
}

// about is the start of --help.
const about = `rdzv-agent runs on every GPU node: it registers the node with the
rdzv controller, starts and supervises the workers of the jobs the
controller assigns to the node, and reports their state, progress and
checkpoints. Under systemd it runs as deploy/systemd/rdzv-agent.service.`

// config is the agent's configuration from args, and what read it (for
// the reference of the config file's fields).
func config(args []string) (agent.Config, *cli.File, error) {
	fs := flag.NewFlagSet("rdzv-agent", flag.ContinueOnError)
	def := agent.DefaultConfig()
	path := fs.String("config", "", "YAML config file (see deploy/config/agent.yaml); flags override it")
	controllerAddr := cli.ControllerFlag(fs)
	relays := fs.String("relays", "", "rdzv-relay host:port,... tried before the controller (default: none)")
	name := fs.String("node-name", "", "node name (default: the hostname)")
	labels := fs.String("labels", "", "node labels k=v,k2=v2 (\"topology\" orders ranks)")
	iface := fs.String("nccl-interface", "", "interface for NCCL/Gloo (default: picked automatically)")
	gossipPort := fs.Int("gossip-port", def.GossipPort, "memberlist gossip port on the NCCL interface (0: any free port, -1: off)")
	peerPort := fs.Int("peer-port", def.PeerPort, "in-memory checkpoint peer listener port on the NCCL interface (0: any free port, -1: off)")
	fake := fs.Int("fake-gpus", 0, "pretend to have N GPUs, for scheduling tests on CPU hosts")
	stateDir := fs.String("state-dir", def.StateDir, "directory for job logs and scratch workdirs")
	grace := fs.Duration("stop-grace", def.StopGrace.Duration, "time between SIGTERM and SIGKILL when stopping workers")
	restartGrace := fs.Duration("restart-grace", def.RestartGrace.Duration, "how long workers run on after the agent stops, for the next agent to adopt them (0: stop them with the agent)")
	level := fs.String("log-level", def.LogLevel, "debug, info, warn or error")
	secretsDir := fs.String("secrets-dir", def.SecretsDir, "directory holding the files jobs may name in env_files")
	runAs := fs.String("run-as", def.RunAs, "user workers run as unless the job names one (name or uid[:gid]; empty: a dynamic user of the job's own, from dynamic_users)")
	allowRoot := fs.Bool("allow-root", def.AllowRoot, "let workers run as root")
	tlsFiles := cli.TLSFlags(fs, "agent")
	insecure := fs.Bool("insecure", false, "connect without TLS, to a controller started with --insecure (local tests and the demo only)")
	httpListen := fs.String("http-listen", def.HTTP.Listen, "metrics (/metrics) and health (/healthz, /readyz) listen address; empty turns it off")
	cfg, f, err := cli.ParseConfig(fs, args, about, path, def, agent.LoadConfig)
	if err != nil {
		return cfg, f, err
	}
	override := f.Override
	cli.ApplyController(f, controllerAddr, &cfg.Controller)
	override("relays", "relays", func() { cfg.Relays = *relays })
	override("node-name", "node_name", func() { cfg.NodeName = *name })
	var labelsErr error
	override("labels", "labels", func() { cfg.Labels, labelsErr = cli.ParseLabels(*labels) })
	override("nccl-interface", "nccl_interface", func() { cfg.NCCLInterface = *iface })
	override("gossip-port", "gossip_port", func() { cfg.GossipPort = *gossipPort })
	override("peer-port", "peer_port", func() { cfg.PeerPort = *peerPort })
	override("fake-gpus", "fake_gpus", func() { cfg.FakeGPUs = *fake })
	override("state-dir", "state_dir", func() { cfg.StateDir = *stateDir })
	if abs, err := filepath.Abs(cfg.StateDir); err == nil {
		cfg.StateDir = abs
	}
	if cfg.NodeName == "" {
		// The hostname names the node; addresses always come from interfaces.
		host, err := os.Hostname()
		if err != nil {
			return cfg, f, f.Done(fmt.Errorf("reading hostname for the node name (set --node-name): %w", err))
		}
		if wire.ValidateName("node_name", host) != nil {
			return cfg, f, f.Done(fmt.Errorf("the hostname %q is not a valid node name (lowercase letters, digits and '-', at most 63); set --node-name or node_name", host))
		}
		cfg.NodeName = host
	}
	override("stop-grace", "stop_grace", func() { cfg.StopGrace.Duration = *grace })
	override("restart-grace", "restart_grace", func() { cfg.RestartGrace.Duration = *restartGrace })
	override("log-level", "log_level", func() { cfg.LogLevel = *level })
	override("secrets-dir", "secrets_dir", func() { cfg.SecretsDir = *secretsDir })
	override("run-as", "run_as", func() { cfg.RunAs = *runAs })
	override("allow-root", "allow_root", func() { cfg.AllowRoot = *allowRoot })
	override("insecure", "insecure", func() { cfg.Insecure = *insecure })
	override("http-listen", "http.listen", func() { cfg.HTTP.Listen = *httpListen })
	tlsFiles.Apply(f, "tls", &cfg.TLS)
	return cfg, f, f.Done(errors.Join(labelsErr, cfg.Validate(), cli.CheckLogLevel(cfg.LogLevel)))
}
