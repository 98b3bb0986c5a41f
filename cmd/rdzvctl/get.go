package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/jobspec"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// getCmd is `rdzvctl get job NAME`, kubectl's get: a row by default, and
// with -o yaml the object as it is written, here the job.yaml that start
// takes (status -o yaml shows the job's whole state instead).
func (c *command) getCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print a job's job.yaml (-o yaml), to edit and start again",
		Long: `Print an object as it is written: get job NAME -o yaml prints the job.yaml
of a job as the controller stores it, which rdzvctl start and validate take
(export, edit, start). status NAME -o yaml prints the job's whole state.`,
		Example: `  rdzvctl get job train -o yaml > train.yaml
  rdzvctl get job train -o yaml | sed 's/^name: train$/name: train-2/' | rdzvctl start -`,
		Args: commandArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("%w: get takes what to get: job NAME", errUsage)
		},
	}
	cmd.AddCommand(c.getJobCmd())
	return cmd
}

func (c *command) getJobCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "job NAME",
		Aliases: []string{"jobs"},
		Short:   "Print a job: a row, or with -o yaml or json its job.yaml",
		Long: `Print a job: a row as list prints it (-o table, wide or name), or its
job.yaml (-o yaml; -o json and jsonpath read the same document): the job
file as the controller stores it, with the defaults it filled in written
out and relative paths resolved. rdzvctl start takes it as it is; change the
name (or delete the finished job) first.

secret_env values are never shown: their names are left in a comment at the
top and on stderr, to be set again before starting.`,
		Example: `  rdzvctl get job train
  rdzvctl get job train -o yaml > train.yaml && rdzvctl start train.yaml
  rdzvctl get job train -o jsonpath='{.nodes.max}'`,
		Args:              exactArgs(1, "get job takes one job name"),
		ValidArgsFunction: c.completeJobs,
		RunE: func(cmd *cobra.Command, args []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			resp, err := unary(cmd.Context(), c, "getting job", func(ctx context.Context, cl *client.Client) (*rdzvv1.GetJobResponse, error) {
				return cl.GetJob(ctx, &rdzvv1.GetJobRequest{Name: args[0]})
			})
			if err != nil {
				return err
			}
			job := resp.GetJob()
			if !o.structured() {
				return render(c.out, o, jobs, []*rdzvv1.Job{job})
			}
			e, err := jobspec.Export(job.GetSpec())
			if err != nil {
				return err
			}
			for _, name := range e.Withheld {
				fmt.Fprintf(c.errOut, "warning: job %s: secret_env %s: value withheld by the controller; set it again before starting\n", args[0], name)
			}
			if o.kind != "yaml" {
				return printStructured(c.out, o, e.JSON)
			}
			y, err := e.YAML()
			if err != nil {
				return err
			}
			_, err = c.out.Write(y)
			return err
		},
	}
	return prints(cmd, allOutputs...)
}
