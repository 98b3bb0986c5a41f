package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdzv/rdzv/buildinfo"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
)

// versions is what `rdzvctl version` prints in structured formats.
type versions struct {
	Client buildinfo.Info `json:"client"`
	Server *serverInfo    `json:"server,omitempty"`
}

type serverInfo struct {
	buildinfo.Info
	LeaderAddr string `json:"leader_addr"`
}

func (c *command) versionCmd() *cobra.Command {
	var clientOnly bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print rdzvctl's version and the leading controller's",
		Example: `  rdzvctl version
  rdzvctl version --client -o json`,
		Args: exactArgs(0, "version takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			v := versions{Client: buildinfo.Get()}
			var serverErr error
			if !clientOnly {
				serverErr = c.serverVersion(cmd, &v)
			}
			if o.structured() {
				doc, err := json.Marshal(v)
				if err != nil {
					return err
				}
				if err := printStructured(c.out, o, doc); err != nil {
					return err
				}
			} else {
				printVersions(c.out, v)
			}
			return serverErr
		},
	}
	cmd.Flags().BoolVar(&clientOnly, "client", false, "rdzvctl's version only, without asking the controller")
	return prints(cmd, dataOutputs...)
}

// serverVersion asks the leader for its build. A controller that predates
// GetServerInfo is reported as such, not as a failure.
func (c *command) serverVersion(cmd *cobra.Command, v *versions) error {
	client, err := c.dial()
	if err != nil {
		return err
	}
	cctx, cancel := c.call(cmd.Context())
	defer cancel()
	resp, err := client.GetServerInfo(cctx, &rdzvv1.GetServerInfoRequest{})
	switch {
	case status.Code(err) == codes.Unimplemented:
		v.Server = &serverInfo{Info: buildinfo.Info{Version: "unknown (the controller is older than GetServerInfo)"}}
		return nil
	case err != nil:
		return c.rpcErr("asking the controller its version", err)
	}
	v.Server = &serverInfo{Info: buildinfo.Info{Version: resp.GetVersion(), Commit: resp.GetCommit(), GoVersion: resp.GetGoVersion(),
		Platform: resp.GetPlatform()}, LeaderAddr: resp.GetLeaderAddr()}
	return nil
}

func printVersions(w io.Writer, v versions) {
	fmt.Fprintf(w, "Client: %s\n", v.Client)
	if v.Server != nil {
		if v.Server.Commit == "" {
			fmt.Fprintf(w, "Server: %s\n", v.Server.Version)
			return
		}
		fmt.Fprintf(w, "Server: %s, leader %s\n", v.Server.Info, v.Server.LeaderAddr)
	}
}
