package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/rdzv/rdzv/jobspec"
	"github.com/rdzv/rdzv/wire"
)

func (c *command) initCmd() *cobra.Command {
	var from, file, name string
	cmd := &cobra.Command{
		Use:   "init --from 'LAUNCH LINE'",
		Short: "Write a job.yaml for a torchrun, deepspeed, accelerate launch or python line",
		Long: `Write the job.yaml that runs what a launch line ran by hand: torchrun (or
python -m torch.distributed.run), deepspeed, accelerate launch, or python
with a script. The line is split as a shell would, without expanding
anything; leading NAME=value words become env.

rdzv runs the launcher on every node itself with what it assigns, so the
line's node count and workers per node become nodes and procs_per_node, its
script and arguments command, its other launcher options
launcher.extra_args; what rdzv assigns (ranks, rendezvous, master address
and port, hostfiles, devices) is left out, each listed in a comment. The
job.yaml goes to stdout, or to --file, which must not exist yet. Check it
with rdzvctl validate.`,
		Example: `  rdzvctl init --from 'torchrun --nnodes 2 --nproc_per_node 8 train.py --lr 3e-4'
  rdzvctl init --from 'deepspeed --num_gpus 8 train.py --deepspeed ds.json' --file job.yaml`,
		Args: exactArgs(0, "init takes the line in --from, quoted"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" {
				return fmt.Errorf("%w: --from is required: the launch line, quoted", errUsage)
			}
			t, err := jobspec.FromShellLine(from)
			if err != nil {
				return fmt.Errorf("%w: --from: %w", errUsage, err)
			}
			if name == "" {
				name = t.NameFor()
			} else if fe := wire.ValidateName("--name", name); fe != nil {
				return fmt.Errorf("%w: %w", errUsage, fe)
			}
			out := t.YAML(name, from)
			if file == "" {
				_, err := fmt.Fprint(c.out, out)
				return err
			}
			f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if errors.Is(err, os.ErrExist) {
				return fmt.Errorf("%s exists; rdzvctl init does not overwrite a job file", file)
			}
			if err != nil {
				return fmt.Errorf("writing the job file: %w", err)
			}
			if _, err := f.WriteString(out); err != nil {
				f.Close()
				return fmt.Errorf("writing the job file: %w", err)
			}
			if err := f.Close(); err != nil {
				return fmt.Errorf("writing the job file: %w", err)
			}
			fmt.Fprintf(c.errOut, "wrote %s; check it with: rdzvctl validate %s\n", file, file)
			return nil
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the launch line, quoted: torchrun ..., deepspeed ..., accelerate launch ... or python ...")
	cmd.Flags().StringVarP(&file, "file", "f", "", "write the job.yaml to this new file instead of stdout")
	cmd.Flags().StringVar(&name, "name", "", "the job's name (default: the training script's)")
	return cmd
}
