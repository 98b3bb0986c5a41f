// Command rdzv-controller runs the rdzv control plane.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/rdzv/rdzv/cmd/internal/cli"
	"github.com/rdzv/rdzv/controller"
)

func main() {
	cfg, err := config(os.Args[1:])
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	log, err := cli.NewLogger(cfg.LogLevel)
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	ctl, err := controller.New(cfg, log.Named("controller"))
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	cli.RunDaemon("rdzv-controller", log, ctl)
}

func config(args []string) (controller.Config, error) {
	fs := flag.NewFlagSet("rdzv-controller", flag.ContinueOnError)
	def := controller.DefaultConfig()
	path := fs.String("config", "", "YAML config file (see deploy/config/controller.yaml); flags override it")
	listen := fs.String("listen", def.Listen, "gRPC listen address")
	dataDir := fs.String("data-dir", def.DataDir, "embedded etcd data directory")
	endpoints := fs.String("etcd-endpoints", "", "comma-separated external etcd endpoints; empty runs embedded etcd")
	dial := fs.Duration("etcd-dial-timeout", def.Etcd.DialTimeout.Duration, "etcd dial timeout")
	clientURL := fs.String("embedded-etcd-client-url", def.EmbeddedEtcd.ClientURL, "embedded etcd client URL")
	peerURL := fs.String("embedded-etcd-peer-url", def.EmbeddedEtcd.PeerURL, "embedded etcd peer URL")
	hbInterval := fs.Duration("heartbeat-interval", def.Heartbeat.Interval.Duration, "agent heartbeat interval")
	hbTimeout := fs.Duration("heartbeat-timeout", def.Heartbeat.Timeout.Duration, "time without heartbeat before a node is lost")
	ports := fs.String("master-port-range", fmt.Sprintf("%d-%d", def.MasterPortRange.Min, def.MasterPortRange.Max), "torchrun master port range MIN-MAX")
	flakyLosses := fs.Int("flaky-node-losses", def.FlakyNodes.Losses, "cordon a node lost this many times within --flaky-node-window while running jobs (0: never)")
	flakyWindow := fs.Duration("flaky-node-window", def.FlakyNodes.Window.Duration, "window for --flaky-node-losses")
	level := fs.String("log-level", def.LogLevel, "debug, info, warn or error")
	tlsFiles := cli.TLSFlags(fs, "controller")
	insecure := fs.Bool("insecure", false, "serve without TLS or authentication (local tests and the demo only)")
	if err := fs.Parse(args); err != nil {
		return def, err
	}
	cfg := def
	if *path != "" {
		var err error
		if cfg, err = controller.LoadConfig(*path); err != nil {
			return cfg, err
		}
	}
	set := cli.Set(fs)
	override := func(name string, apply func()) {
		if set[name] {
			apply()
		}
	}
	override("listen", func() { cfg.Listen = *listen })
	override("data-dir", func() { cfg.DataDir = *dataDir })
	override("etcd-endpoints", func() { cfg.Etcd.Endpoints = strings.Split(*endpoints, ",") })
	override("etcd-dial-timeout", func() { cfg.Etcd.DialTimeout.Duration = *dial })
	override("embedded-etcd-client-url", func() { cfg.EmbeddedEtcd.ClientURL = *clientURL })
	override("embedded-etcd-peer-url", func() { cfg.EmbeddedEtcd.PeerURL = *peerURL })
	override("heartbeat-interval", func() { cfg.Heartbeat.Interval.Duration = *hbInterval })
	override("heartbeat-timeout", func() { cfg.Heartbeat.Timeout.Duration = *hbTimeout })
	override("flaky-node-losses", func() { cfg.FlakyNodes.Losses = *flakyLosses })
	override("flaky-node-window", func() { cfg.FlakyNodes.Window.Duration = *flakyWindow })
	override("log-level", func() { cfg.LogLevel = *level })
	override("insecure", func() { cfg.Insecure = *insecure })
	tlsFiles.Apply(fs, &cfg.TLS)
	if set["master-port-range"] {
		if _, err := fmt.Sscanf(*ports, "%d-%d", &cfg.MasterPortRange.Min, &cfg.MasterPortRange.Max); err != nil {
			return cfg, fmt.Errorf("--master-port-range: %q is not MIN-MAX", *ports)
		}
	}
	return cfg, cfg.Validate()
}
