// Command rdzvctl is the operator's CLI for rdzv.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

const usage = `rdzvctl: operate rdzv training jobs

Usage:
  rdzvctl [global flags] COMMAND [flags] [args]

Commands:
  start JOB.yaml [--wait]          validate and submit a job; --wait follows it to the end
  status [JOB]                     one job in detail, or all jobs (as list)
  list [--state S,...] [--limit N] all jobs, oldest first, or those in these states
  delete JOB                       remove a finished job and all kept for it (events too)
  nodes [--state S,...] [--selector k=v,...] [--limit N]
                                   the node registry, or the nodes in these states with these labels
  nodes cordon|uncordon NODE [--reason R]
                                   keep new work off a node, or let it take work again
  logs JOB [--node N] [-f] [--tail BYTES]
                                   a job's output from one node (default: node rank 0)
  events [JOB] [--limit N] [-f]    a job's events, or cluster events without JOB; -f/--follow
                                   prints every event as it is written (all jobs' without JOB)
  stop JOB [--wait]                stop a job's workers on every node
  pki init|issue|show ...          the cluster CA, on files only (README "Certificates")
  pki revoke ROLE/NAME | --serial SERIAL | --cert FILE [--reason R]
                                   put certificates on the controller's deny-list: refused
                                   from then on, open connections closed
  pki revocations                  the controller's deny-list

Global flags (also accepted after the command):
  --controller HOST:PORT[,...]     controller address, or every replica's: the leader is found
                                   (default $RDZV_CONTROLLER or 127.0.0.1:7070)
  -o table|json                    output format (default table)
  --timeout DURATION               per-request timeout (default 10s)
  --tls-dir DIR                    ca.crt, rdzvctl.crt and rdzvctl.key (default $RDZV_TLS_DIR or ~/.rdzv)
  --tls-cert, --tls-key, --tls-ca FILE
                                   override one file of --tls-dir
  --insecure                       no TLS; only for a controller started with --insecure
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdzvctl: %v\n", err)
	}
	os.Exit(code)
}

// errUsage marks command-line mistakes (exit code 2).
var errUsage = errors.New("usage")

// run executes one command and returns the process exit code.
func run(ctx context.Context, args []string, out io.Writer) (int, error) {
	g := defaultGlobals()
	fs := flag.NewFlagSet("rdzvctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	g.register(fs)
	if err := fs.Parse(args); err != nil {
		fmt.Fprint(os.Stderr, usage)
		return 2, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2, nil
	}
	cmd, cmdArgs := rest[0], rest[1:]
	c := &command{globals: g, out: out}
	var runErr error
	switch cmd {
	case "start":
		runErr = c.start(ctx, cmdArgs)
	case "status":
		runErr = c.status(ctx, cmdArgs)
	case "list":
		runErr = c.list(ctx, cmdArgs)
	case "nodes":
		runErr = c.nodes(ctx, cmdArgs)
	case "logs":
		runErr = c.logs(ctx, cmdArgs)
	case "events":
		runErr = c.events(ctx, cmdArgs)
	case "stop":
		runErr = c.stop(ctx, cmdArgs)
	case "delete":
		runErr = c.deleteJob(ctx, cmdArgs)
	case "pki":
		runErr = c.pki(ctx, cmdArgs)
	case "help", "-h", "--help":
		fmt.Fprint(out, usage)
		return 0, nil
	default:
		fmt.Fprint(os.Stderr, usage)
		return 2, fmt.Errorf("unknown command %q", cmd)
	}
	c.close()
	switch {
	case runErr == nil:
		return 0, nil
	case errors.Is(runErr, errUsage):
		return 2, runErr
	default:
		return 1, runErr
	}
}

// parse accepts a command's flags before and after its positional
// arguments (`rdzvctl start job.yaml --wait`).
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
