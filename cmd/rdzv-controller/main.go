// Command rdzv-controller runs the rdzv control plane.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/rdzv/rdzv/cmd/internal/cli"
	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/dashboard"
	"github.com/rdzv/rdzv/internal/httpserve"
)

func main() {
	cfg, pprofSocket, _, err := config(os.Args[1:])
	if errors.Is(err, cli.ErrExit) {
		return
	}
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	log, err := cli.NewLogger(cfg.LogLevel)
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	if pprofSocket != "" {
		if err := cli.ServePprof(pprofSocket, log.Named("pprof")); err != nil {
			cli.Fatal("rdzv-controller", err)
		}
	}
	ctl, err := controller.New(cfg, log.Named("controller"))
	if err != nil {
		cli.Fatal("rdzv-controller", err)
	}
	mountDashboard(cfg.HTTP, ctl, log)
	cli.RunDaemon("rdzv-controller", log, ctl)
}

// mountDashboard serves the read-only dashboard beside the metrics, but
// only where no one without a cluster certificate can reach it: on a
// loopback listener, or one that verifies client certificates. A listener
// opened wider for Prometheus serves metrics and health only.
func mountDashboard(cfg httpserve.Config, ctl *controller.Controller, log *zap.Logger) {
	srv := ctl.HTTP()
	switch {
	case srv == nil:
	case !cfg.Private():
		log.Info("dashboard off: http.listen is reachable from other hosts without a client certificate; set http.client_ca_file or listen on loopback",
			zap.String("listen", cfg.Listen))
	default:
		srv.Handle("/", dashboard.New(ctl.ReadOnly(), log.Named("dashboard")))
		log.Info("dashboard on", zap.String("listen", cfg.Listen))
	}
}

// about is the start of --help.
const about = `rdzv-controller is the rdzv control plane: it keeps the cluster's
state in etcd (embedded unless --etcd-endpoints), elects a leader among
its replicas, admits jobs, runs their rendezvous on the agents' nodes and
recovers them from failures. Under systemd it runs as
deploy/systemd/rdzv-controller.service.`

// config is the controller's configuration from args, and what read it (for the
// reference of the config file's fields).
func config(args []string) (cfg controller.Config, pprofSocket string, f *cli.File, err error) {
	fs := flag.NewFlagSet("rdzv-controller", flag.ContinueOnError)
	def := controller.DefaultConfig()
	path := fs.String("config", "", "YAML config file (see deploy/config/controller.yaml); flags override it")
	listen := fs.String("listen", def.Listen, "gRPC listen address")
	advertise := fs.String("advertise-addr", "", "host:port clients reach this controller at, sent to them by followers (default: --listen when it names a host)")
	leaseTTL := fs.Duration("leader-lease-ttl", def.LeaderLeaseTTL.Duration, "how long a crashed leader keeps the lead before a follower takes over")
	dataDir := fs.String("data-dir", def.DataDir, "controller state: the embedded etcd's data and its socket (kept 0700)")
	secretsKey := fs.String("secrets-key-file", "", "keyring sealing jobs' secret_env in etcd (default DATA_DIR/secrets.key, created with embedded etcd)")
	endpoints := fs.String("etcd-endpoints", "", "comma-separated external etcd endpoints; empty runs embedded etcd")
	dial := fs.Duration("etcd-dial-timeout", def.Etcd.DialTimeout.Duration, "etcd dial timeout")
	reqTimeout := fs.Duration("etcd-request-timeout", def.Etcd.RequestTimeout.Duration, "bound on each etcd request")
	caFile := fs.String("etcd-cacert", "", "CA bundle verifying the external etcd servers (client TLS)")
	certFile := fs.String("etcd-cert", "", "client certificate for the external etcd")
	keyFile := fs.String("etcd-key", "", "client key for the external etcd")
	compaction := fs.Duration("etcd-compaction-interval", def.Etcd.CompactionInterval.Duration, "how often the leader compacts etcd history (0: off)")
	hbInterval := fs.Duration("heartbeat-interval", def.Heartbeat.Interval.Duration, "agent heartbeat interval")
	hbTimeout := fs.Duration("heartbeat-timeout", def.Heartbeat.Timeout.Duration, "time without heartbeat before a node is lost")
	vouched := fs.Duration("heartbeat-vouched-timeout", def.Heartbeat.VouchedTimeout.Duration, "time a silent node that its gossip peers still reach keeps its job; also how long jobs survive without any controller")
	ports := fs.String("master-port-range", fmt.Sprintf("%d-%d", def.MasterPortRange.Min, def.MasterPortRange.Max), "torchrun master port range MIN-MAX")
	flakyLosses := fs.Int("flaky-node-losses", def.FlakyNodes.Losses, "cordon a node lost this many times within --flaky-node-window while running jobs (0: never)")
	flakyWindow := fs.Duration("flaky-node-window", def.FlakyNodes.Window.Duration, "window for --flaky-node-losses")
	level := fs.String("log-level", def.LogLevel, "debug, info, warn or error")
	tlsFiles := cli.TLSFlags(fs, "controller")
	insecure := fs.Bool("insecure", false, "serve without TLS or authentication (local tests and the demo only)")
	httpListen := fs.String("http-listen", def.HTTP.Listen, "metrics (/metrics) and health (/healthz, /readyz) listen address; empty turns it off")
	pprofSock := cli.PprofFlag(fs)
	cfg, f, err = cli.ParseConfig(fs, args, about, path, def, controller.LoadConfig)
	if err != nil {
		return cfg, "", f, err
	}
	override := f.Override
	override("listen", "listen", func() { cfg.Listen = *listen })
	override("advertise-addr", "advertise_addr", func() { cfg.AdvertiseAddr = *advertise })
	override("leader-lease-ttl", "leader_lease_ttl", func() { cfg.LeaderLeaseTTL.Duration = *leaseTTL })
	override("etcd-request-timeout", "etcd.request_timeout", func() { cfg.Etcd.RequestTimeout.Duration = *reqTimeout })
	override("etcd-cacert", "etcd.ca_file", func() { cfg.Etcd.CAFile = *caFile })
	override("etcd-cert", "etcd.cert_file", func() { cfg.Etcd.CertFile = *certFile })
	override("etcd-key", "etcd.key_file", func() { cfg.Etcd.KeyFile = *keyFile })
	override("etcd-compaction-interval", "etcd.compaction_interval", func() { cfg.Etcd.CompactionInterval.Duration = *compaction })
	override("heartbeat-vouched-timeout", "heartbeat.vouched_timeout", func() { cfg.Heartbeat.VouchedTimeout.Duration = *vouched })
	override("data-dir", "data_dir", func() { cfg.DataDir = *dataDir })
	override("secrets-key-file", "secrets_key_file", func() { cfg.SecretsKeyFile = *secretsKey })
	override("etcd-endpoints", "etcd.endpoints", func() { cfg.Etcd.Endpoints = strings.Split(*endpoints, ",") })
	override("etcd-dial-timeout", "etcd.dial_timeout", func() { cfg.Etcd.DialTimeout.Duration = *dial })
	override("heartbeat-interval", "heartbeat.interval", func() { cfg.Heartbeat.Interval.Duration = *hbInterval })
	override("heartbeat-timeout", "heartbeat.timeout", func() { cfg.Heartbeat.Timeout.Duration = *hbTimeout })
	override("flaky-node-losses", "flaky_nodes.losses", func() { cfg.FlakyNodes.Losses = *flakyLosses })
	override("flaky-node-window", "flaky_nodes.window", func() { cfg.FlakyNodes.Window.Duration = *flakyWindow })
	override("log-level", "log_level", func() { cfg.LogLevel = *level })
	override("insecure", "insecure", func() { cfg.Insecure = *insecure })
	override("http-listen", "http.listen", func() { cfg.HTTP.Listen = *httpListen })
	tlsFiles.Apply(f, "tls", &cfg.TLS.Files)
	var portsErr error
	override("master-port-range", "master_port_range", func() {
		if _, err := fmt.Sscanf(*ports, "%d-%d", &cfg.MasterPortRange.Min, &cfg.MasterPortRange.Max); err != nil {
			portsErr = fmt.Errorf("--master-port-range: %q is not MIN-MAX", *ports)
		}
	})
	return cfg, *pprofSock, f, f.Done(errors.Join(portsErr, cfg.Validate(), cli.CheckLogLevel(cfg.LogLevel)))
}
