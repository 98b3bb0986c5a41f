// Command rdzvctl is the operator's CLI for rdzv.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/jonboulle/clockwork"
	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rdzvctl: %v\n", err)
	}
	os.Exit(code)
}

// errUsage marks command-line mistakes (exit code 2).
var errUsage = errors.New("usage")

// run executes one command line and returns the process exit code: 0, 1
// when the command failed, 2 for a command-line mistake (a bad flag,
// argument or format), with the usage on errOut.
func run(ctx context.Context, args []string, out, errOut io.Writer) (int, error) {
	c := &command{globals: defaultGlobals(), out: out, errOut: errOut, clock: clockwork.NewRealClock()}
	if fi, err := os.Stdin.Stat(); err == nil && fi.Mode()&os.ModeCharDevice == 0 {
		c.in = os.Stdin // piped or redirected, not a terminal
	}
	return runWith(ctx, c, args)
}

// runWith runs a command line with c's streams and clock.
func runWith(ctx context.Context, c *command, args []string) (int, error) {
	root := c.root()
	root.SetArgs(args)
	root.SetOut(c.out)
	root.SetErr(c.errOut)
	err := root.ExecuteContext(ctx)
	c.close()
	switch {
	case err == nil && c.noCommand:
		return 2, nil
	case err == nil:
		return 0, nil
	case errors.Is(err, errUsage) || !c.ran:
		// Cobra's own refusals (an unknown command or flag, wrong
		// arguments) come before any command ran.
		return 2, err
	default:
		return 1, err
	}
}

// commandArgs is the Args of a command that only groups others: an
// argument is a command it does not have, named with the nearest ones
// (cobra's own suggestions are made only for a root without Args).
func commandArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = suggestionDistance
	}
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return fmt.Errorf("%s\n\nSee '%s --help' for usage", msg, cmd.CommandPath())
}

// suggestionDistance is how many edits from a command a mistyped name may
// be to be suggested (cobra's default).
const suggestionDistance = 2

// root is rdzvctl's command tree.
func (c *command) root() *cobra.Command {
	root := &cobra.Command{
		Use:   "rdzvctl",
		Short: "Operate rdzv training jobs",
		Long: `rdzvctl operates rdzv: multi-node PyTorch jobs on bare-metal GPU nodes.

It talks to the controller (--controller, or every replica's address: the
leader is found) over mutual TLS with the operator's certificate from
--tls-dir (ca.crt, rdzvctl.crt, rdzvctl.key). The pki commands work on files
and make those certificates.`,
		Example: `  rdzvctl start job.yaml --wait
  rdzvctl list --state running -o wide
  rdzvctl logs train --tail 20 -f
  rdzvctl nodes drain gpu-07`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          commandArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// No command: the usage, as a mistake (scripts that forgot one
			// get a non-zero exit).
			cmd.SetOut(c.errOut)
			c.noCommand = true
			return cmd.Help()
		},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			c.ran = true
			return checkOutput(cmd, c.output, c.clock)
		},
	}
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w: %w (see %s --help)", errUsage, err, cmd.CommandPath())
	})
	c.register(root.PersistentFlags())
	c.flags = root.PersistentFlags()
	root.AddGroup(&cobra.Group{ID: "jobs", Title: "Jobs:"}, &cobra.Group{ID: "cluster", Title: "Cluster:"})
	for _, sub := range []*cobra.Command{c.initCmd(), c.startCmd(), c.validateCmd(), c.statusCmd(), c.listCmd(), c.getCmd(), c.logsCmd(), c.eventsCmd(), c.stopCmd(), c.deleteCmd()} {
		sub.GroupID = "jobs"
		root.AddCommand(sub)
	}
	for _, sub := range []*cobra.Command{c.nodesCmd(), c.pkiCmd(), c.configCmd(), c.versionCmd()} {
		sub.GroupID = "cluster"
		root.AddCommand(sub)
	}
	root.SetHelpCommandGroupID("cluster")
	root.SetCompletionCommandGroupID("cluster")
	// Made now rather than when run, so that the help goldens and docs/cli
	// include them.
	root.InitDefaultCompletionCmd()
	root.InitDefaultHelpCmd()
	describeOutputs(root)
	return root
}
