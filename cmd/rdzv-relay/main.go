// Command rdzv-relay carries many agents' streams to the controller as
// frames of one stream.
package main

import (
	"errors"
	"flag"
	"os"

	"github.com/rdzv/rdzv/cmd/internal/cli"
	"github.com/rdzv/rdzv/relay"
)

func main() {
	cfg, pprofSocket, _, err := config(os.Args[1:])
	if errors.Is(err, cli.ErrExit) {
		return
	}
	if err != nil {
		cli.Fatal("rdzv-relay", err)
	}
	log, err := cli.NewLogger(cfg.LogLevel)
	if err != nil {
		cli.Fatal("rdzv-relay", err)
	}
	if pprofSocket != "" {
		if err := cli.ServePprof(pprofSocket, log.Named("pprof")); err != nil {
			cli.Fatal("rdzv-relay", err)
		}
	}
	r, err := relay.New(cfg, log.Named("relay"))
	if err != nil {
		cli.Fatal("rdzv-relay", err)
	}
	cli.RunDaemon("rdzv-relay", log, r)
}

// about is the start of --help.
const about = `rdzv-relay carries the streams of the agents that connect to it to the
rdzv controller, all as frames of one stream, their messages batched:
on a large cluster, a few relays, each carrying thousands of agents,
cut the controller's connections and streams to one per relay, and its
CPU and memory with them (docs/install.md#relays, "How many").
Agents list it in their relays setting and reach the controller directly
when it fails. Under systemd it runs as deploy/systemd/rdzv-relay.service.`

// config is the relay's configuration from args, and what read it (for the
// reference of the config file's fields).
func config(args []string) (cfg relay.Config, pprofSocket string, f *cli.File, err error) {
	fs := flag.NewFlagSet("rdzv-relay", flag.ContinueOnError)
	def := relay.DefaultConfig()
	path := fs.String("config", "", "YAML config file (see deploy/config/relay.yaml); flags override it")
	listen := fs.String("listen", def.Listen, "gRPC listen address for agents")
	controllerAddr := cli.ControllerFlag(fs)
	level := fs.String("log-level", def.LogLevel, "debug, info, warn or error")
	tlsFiles := cli.TLSFlags(fs, "relay")
	httpListen := fs.String("http-listen", def.HTTP.Listen, "metrics (/metrics) and health (/healthz, /readyz) listen address; empty turns it off")
	pprofSock := cli.PprofFlag(fs)
	cfg, f, err = cli.ParseConfig(fs, args, about, path, def, relay.LoadConfig)
	if err != nil {
		return cfg, "", f, err
	}
	cli.ApplyController(f, controllerAddr, &cfg.Controller)
	f.Override("listen", "listen", func() { cfg.Listen = *listen })
	f.Override("log-level", "log_level", func() { cfg.LogLevel = *level })
	f.Override("http-listen", "http.listen", func() { cfg.HTTP.Listen = *httpListen })
	tlsFiles.Apply(f, "tls", &cfg.TLS)
	return cfg, *pprofSock, f, f.Done(errors.Join(cfg.Validate(), cli.CheckLogLevel(cfg.LogLevel)))
}
