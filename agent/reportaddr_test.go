package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/rdzv/rdzv/agent/gpu"
	"github.com/rdzv/rdzv/agent/netif"
)

// freeLoopbackAddr is an address on 127.0.0.1 nothing listens on now.
func freeLoopbackAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestListenReports(t *testing.T) {
	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer squatter.Close()
	taken := squatter.Addr().String()

	const none = "none" // no address file
	tests := []struct {
		name     string
		recorded string
		keep     bool
		// wantSame: the recorded address is listened on again.
		wantSame bool
		wantErr  string
	}{
		{name: "first start", recorded: none},
		{name: "restart takes the port back", recorded: "FREE", wantSame: true},
		{name: "restart with adopted workers takes the port back", recorded: "FREE", keep: true, wantSame: true},
		{name: "port taken, nobody reports there: moves", recorded: taken},
		{name: "port taken, adopted workers report there: refuses", recorded: taken, keep: true,
			wantErr: "cannot listen on the recorded worker report address " + taken + " (recorded in STATE/report.addr): listen tcp " + taken + ": bind: address already in use; " +
				"the workers adopted from the previous agent report there, so the agent does not move elsewhere"},
		{name: "not loopback, adopted workers: refuses", recorded: "0.0.0.0:7000", keep: true,
			wantErr: `"0.0.0.0:7000" is not a loopback address`},
		{name: "not loopback, nobody reports there: moves", recorded: "10.0.0.1:7000"},
		{name: "garbage: moves", recorded: "not an address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := t.TempDir()
			path := filepath.Join(state, reportAddrFile)
			recorded := strings.ReplaceAll(tt.recorded, "FREE", freeLoopbackAddr(t))
			if recorded != none {
				require.NoError(t, os.WriteFile(path, []byte(recorded+"\n"), 0o644))
			}
			ln, err := listenReports(state, tt.keep, zaptest.NewLogger(t))
			if tt.wantErr != "" {
				require.ErrorIs(t, err, errReportAddrLost)
				require.ErrorContains(t, err, strings.ReplaceAll(tt.wantErr, "STATE", state))
				b, rerr := os.ReadFile(path)
				require.NoError(t, rerr)
				require.Equal(t, recorded+"\n", string(b), "the recorded address is left for the workers")
				return
			}
			require.NoError(t, err)
			defer ln.Close()
			got := ln.Addr().String()
			host, _, err := net.SplitHostPort(got)
			require.NoError(t, err)
			require.Equal(t, "127.0.0.1", host)
			if tt.wantSame {
				require.Equal(t, recorded, got)
			} else {
				require.NotEqual(t, recorded, got)
			}
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, got, strings.TrimSpace(string(b)), "the address in use is recorded")
		})
	}
}

// TestAgentRefusesToMoveReportAddress restarts an agent whose report port
// was taken while its workers ran on: it refuses to start rather than
// listen elsewhere, and leaves the workers for an agent that can.
func TestAgentRefusesToMoveReportAddress(t *testing.T) {
	h := newSupervisor(t, withRestartGrace(time.Minute))
	h.sup.Assign(h.assignment("train", 1, "hang"))
	h.expect("train", 1, wRunning)
	pid := h.record("train", 1).PID
	token := h.token()
	handOver(t, h, true)

	squatter, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer squatter.Close()
	addrFile := filepath.Join(h.stateDir, reportAddrFile)
	require.NoError(t, os.WriteFile(addrFile, []byte(squatter.Addr().String()), 0o644))

	cfg := h.cfg
	cfg.NodeName, cfg.Insecure, cfg.GossipPort = "node-a", true, -1
	a, err := New(cfg, zaptest.NewLogger(t), gpu.Fake{}, fakeNet{ifaces: []netif.Interface{lo}}, h.spawner)
	require.NoError(t, err)
	err = a.Run(context.Background())
	require.ErrorIs(t, err, errReportAddrLost)
	require.ErrorContains(t, err, squatter.Addr().String())
	require.ErrorContains(t, err, addrFile)
	require.NotEmpty(t, groupMembers(pid), "the workers are left running")

	// An agent that can listen there adopts them, token and all.
	next := h.successor()
	require.True(t, next.sup.Running("train"))
	require.Equal(t, token, next.token(), "the adopted workers' token is kept")
	next.sup.Stop("train", 1, "done")
	next.expect("train", 1, wStopped)
	require.Empty(t, groupMembers(pid))
}
