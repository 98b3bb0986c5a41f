// Command goclient shows the rdzv Go client (package client) at work: it
// starts the job in a job file and follows it to its end, printing the
// job's events as they happen. rdzvctl start --wait does the same.
//
//	go run ./examples/goclient -controller ctl-a:7070,ctl-b:7070 -tls-dir ~/.rdzv examples/job.yaml
//
// The TLS directory holds ca.crt and an operator's certificate as
// rdzvctl.crt and rdzvctl.key (`rdzvctl pki issue operator NAME`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

func main() {
	controllers := flag.String("controller", "127.0.0.1:7070", "controller host:port, or every replica's, comma-separated")
	tlsDir := flag.String("tls-dir", os.ExpandEnv("$HOME/.rdzv"), "directory with ca.crt, rdzvctl.crt and rdzvctl.key")
	insecure := flag.Bool("insecure", false, "no TLS, for a controller started with --insecure")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: goclient [flags] JOB.yaml")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *controllers, *tlsDir, *insecure, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, controllers, tlsDir string, insecure bool, jobFile string) error {
	spec, err := jobspec.LoadFile(jobFile)
	if err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("%s: %w", jobFile, err)
	}

	cfg := client.DefaultConfig()
	if cfg.Endpoints, err = client.ParseAddrs("-controller", controllers); err != nil {
		return err
	}
	if insecure {
		cfg.Insecure = true
	} else {
		cfg.TLS = &client.TLS{Files: pki.Files{
			Cert: filepath.Join(tlsDir, "rdzvctl.crt"),
			Key:  filepath.Join(tlsDir, "rdzvctl.key"),
			CA:   filepath.Join(tlsDir, pki.CACertFile),
		}}
	}
	c, err := client.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()

	// A deadline lets a call wait out a controller failover.
	callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.StartJob(callCtx, &rdzvv1.StartJobRequest{Spec: spec.ToProto()})
	cancel()
	if err != nil {
		return fmt.Errorf("starting job %s: %w", spec.Name, err)
	}
	fmt.Printf("job %s started\n", spec.Name)
	return follow(ctx, c, spec.Name)
}

// follow polls the job and its events each second until the job ends,
// printing the events not printed yet. A failed poll (no controller leads
// for a moment) is tried again on the next tick.
func follow(ctx context.Context, c *client.Client, name string) error {
	printed := map[string]bool{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		job, err := c.GetJob(callCtx, &rdzvv1.GetJobRequest{Name: name})
		var events *rdzvv1.ListEventsResponse
		if err == nil {
			events, err = c.ListEvents(callCtx, &rdzvv1.ListEventsRequest{Job: name})
		}
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "following job %s: %v (retrying)\n", name, err)
		} else {
			for _, ev := range events.GetEvents() {
				key := fmt.Sprint(ev.GetTime().AsTime().UnixNano(), ev.GetKind(), ev.GetNode(), ev.GetMessage())
				// Events from before the job was created belong to an
				// earlier job of the same name.
				if printed[key] || ev.GetTime().AsTime().Before(job.GetJob().GetCreatedAt().AsTime()) {
					continue
				}
				printed[key] = true
				fmt.Printf("%s  %-22s %s\n", ev.GetTime().AsTime().Local().Format("15:04:05.000"), ev.GetKind(), ev.GetMessage())
			}
			switch j := job.GetJob(); j.GetState() {
			case rdzvv1.JobState_JOB_STATE_SUCCEEDED:
				fmt.Printf("job %s succeeded\n", name)
				return nil
			case rdzvv1.JobState_JOB_STATE_FAILED, rdzvv1.JobState_JOB_STATE_STOPPED:
				return fmt.Errorf("job %s ended %s: %s", name, j.GetState(), j.GetReason())
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("interrupted; the job keeps running")
		case <-tick.C:
		}
	}
}
