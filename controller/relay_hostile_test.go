package controller_test

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/rdzv/rdzv/controller"
	"github.com/rdzv/rdzv/pki"
	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// refusedAt is the relay's rdzv_relay_refused_total{at}.
func (r *runningRelay) refusedAt(t *testing.T, at string) float64 {
	t.Helper()
	e := scrape(t, r.relay.HTTPAddr().String())
	if !e.has("rdzv_relay_refused_total", "at", at) {
		return 0
	}
	return e.series(t, "rdzv_relay_refused_total", "at", at).GetCounter().GetValue()
}

// framedConn connects to the relay in frames with conf (the relay's
// certificate is not checked: the peer here is the relay's attacker).
func framedConn(t *testing.T, r *runningRelay, conf *tls.Config) *tls.Conn {
	t.Helper()
	conf = conf.Clone()
	conf.InsecureSkipVerify, conf.NextProtos, conf.MinVersion = true, []string{wire.AgentProtocol}, tls.VersionTLS13
	raw, err := net.Dial("tcp", r.addr)
	require.NoError(t, err)
	conn := tls.Client(raw, conf)
	t.Cleanup(func() { _ = conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(waitTimeout))
	return conn
}

// certConf is a client TLS configuration presenting files' certificate.
func certConf(t *testing.T, files pki.Files) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(files.Cert, files.Key)
	require.NoError(t, err)
	return &tls.Config{Certificates: []tls.Certificate{cert}}
}

// errStreamEnded is a stream that the relay served, and ended.
var errStreamEnded = errors.New("the stream ended")

// TestRelayRefusesAtHandshake: the relay's agent port admits no peer
// without a certificate that verifies against the cluster's CA and is off
// the deny-list: the TLS handshake fails, nothing the peer sends is read,
// and its connection is closed. A valid agent's is served.
func TestRelayRefusesAtHandshake(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	foreign, err := pki.NewCA("foreign", time.Hour, time.Now())
	require.NoError(t, err)
	foreignDir := t.TempDir()
	require.NoError(t, foreign.Save(foreignDir, false))
	foreignAgent, err := foreign.Issue(pki.Request{Identity: pki.Identity{Role: pki.RoleAgent, Name: "node-f"}, ValidFor: time.Minute, Now: time.Now()})
	require.NoError(t, err)
	fcert, fkey, err := foreignAgent.Save(filepath.Join(foreignDir, "node-f"), false)
	require.NoError(t, err)

	revoked := c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-r"})
	_, err = c.certs.RevokeCertificate(rpcCtx(t), &rdzvv1.RevokeCertificateRequest{
		Target: &rdzvv1.RevokeCertificateRequest_Identity{Identity: "agent/node-r"}, Reason: "stolen"})
	require.NoError(t, err)

	// attempt registers node on a connection with conf, in frames, and
	// says whether the relay answered with Registered.
	attempt := func(conf *tls.Config, node string) error {
		conn := framedConn(t, r, conf)
		if err := conn.Handshake(); err != nil {
			return err
		}
		// In TLS 1.3 the client's handshake ends before the server has
		// checked its certificate: a refusal arrives as an alert, which
		// the first read returns.
		writeFramedRegister(t, conn, node)
		kind, p, err := wire.ReadFrame(conn)
		if err != nil {
			return err
		}
		if kind != wire.FrameMessage {
			return errStreamEnded
		}
		var m rdzvv1.ConnectResponse
		require.NoError(t, proto.Unmarshal(p, &m))
		require.NotNil(t, m.GetRegistered(), "%v", &m)
		return nil
	}
	// The relay reads the deny-list once per revocations_refresh; until
	// then the controller refuses the stream the relay opens.
	poll(t, func() bool {
		err := attempt(certConf(t, revoked), "node-r")
		return err != nil && !errors.Is(err, errStreamEnded)
	}, func() string { return "the relay admits a revoked certificate at its handshake" })

	tests := []struct {
		name string
		conf *tls.Config
		node string
	}{
		{"no certificate", &tls.Config{}, "node-a"},
		{"another CA's agent", certConf(t, pki.Files{Cert: fcert, Key: fkey}), "node-f"},
		{"a revoked agent", certConf(t, revoked), "node-r"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := r.refusedAt(t, "handshake")
			err := attempt(tt.conf, tt.node)
			require.Error(t, err)
			require.NotErrorIs(t, err, errStreamEnded, "refused at the handshake, not at the stream's open")
			require.ErrorContains(t, err, "remote error: tls:", "refused by a TLS alert")
			poll(t, func() bool { return r.refusedAt(t, "handshake") > before }, func() string { return "the refusal was not counted" })
		})
	}
	require.NoError(t, attempt(certConf(t, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"})), "node-a"), "a valid agent is served")
	require.Len(t, c.listNodes(), 1)
}

// TestRelayBoundsUnadmittedFrames: before an agent has a stream, its
// frames are bounded by wire.MaxRegisterFrameBytes, read from the length
// alone: a 16 MB header ends the connection with ResourceExhausted. A
// register refused at its open closes the connection too.
func TestRelayBoundsUnadmittedFrames(t *testing.T) {
	c := newCluster(t)
	r := c.startRelay("rack-1")
	conf := certConf(t, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}))
	tests := []struct {
		name string
		send []byte
		code codes.Code
		want string
	}{
		{"a 16 MB header", binary.BigEndian.AppendUint32(nil, 16_000_000), codes.ResourceExhausted, "over the limit of 1048576"},
		{"a register that does not decode", wire.AppendFrame(nil, wire.FrameMessage, []byte{0xff, 0xff}), codes.InvalidArgument, "decoding the agent's register"},
		{"a heartbeat first", mustMessage(t, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: 1}}}),
			codes.InvalidArgument, "the first message on an agent stream must be register"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := framedConn(t, r, conf)
			_, err := conn.Write(tt.send)
			require.NoError(t, err)
			kind, p, err := wire.ReadFrame(conn)
			require.NoError(t, err)
			require.Equal(t, wire.FrameEnd, kind)
			st, err := wire.EndStatus(p)
			require.NoError(t, err)
			require.Equal(t, tt.code, st.Code(), "%v", st)
			require.Contains(t, st.Message(), tt.want)
			_, _, err = wire.ReadFrame(conn)
			require.ErrorIs(t, err, io.EOF, "the relay closed the connection")
		})
	}
	require.Empty(t, c.listNodes())
}

func mustMessage(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := wire.AppendMessage(nil, m)
	require.NoError(t, err)
	return b
}

// TestRelayRefusesOversizeMessage: an admitted agent's message that would
// not fit the relay's call to the controller once framed for it ends that
// agent's stream with ResourceExhausted; the call, and a neighbour's
// heartbeats on it, go on.
func TestRelayRefusesOversizeMessage(t *testing.T) {
	// The agents here send no heartbeats but the neighbour's few, and a
	// 16 MiB message is slow to write under -race: no node is declared
	// lost meanwhile.
	c := newCluster(t, func(cfg *controller.Config) { cfg.Heartbeat.Timeout.Duration = time.Hour })
	r := c.startRelay("rack-1")
	big := c.dialFramed(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-a"}), "node-a")
	good := c.dialFramed(r, c.issue(pki.Identity{Role: pki.RoleAgent, Name: "node-b"}), "node-b")
	poll(t, func() bool { return r.streams(t) == "2" }, func() string { return "the relay carries " + r.streams(t) + " streams" })

	for seq := uint64(1); seq <= 3; seq++ {
		// A frame of the largest size a framed agent may send: its
		// message fits the agent's limit, not the call's with the
		// stream's framing.
		_, err := big.Write(wire.AppendFrame(nil, wire.FrameMessage, make([]byte, wire.MaxMessageBytes)))
		require.NoError(t, err)
		kind, p, err := wire.ReadFrame(big)
		require.NoError(t, err)
		require.Equal(t, wire.FrameEnd, kind)
		st, err := wire.EndStatus(p)
		require.NoError(t, err)
		require.Equal(t, codes.ResourceExhausted, st.Code(), "%v", st)
		require.Contains(t, st.Message(), "over the call's limit")

		_, err = good.Write(mustMessage(t, &rdzvv1.ConnectRequest{Msg: &rdzvv1.ConnectRequest_Heartbeat{Heartbeat: &rdzvv1.Heartbeat{Seq: seq}}}))
		require.NoError(t, err)
		var m rdzvv1.ConnectResponse
		kind, p, err = wire.ReadFrame(good)
		require.NoError(t, err)
		require.Equal(t, wire.FrameMessage, kind)
		require.NoError(t, proto.Unmarshal(p, &m))
		require.Equal(t, seq, m.GetHeartbeatAck().GetSeq(), "the neighbour's stream goes on: %v", &m)

		// The oversize agent's connection carries its next stream.
		writeFramedRegister(t, big, "node-a")
		kind, p, err = wire.ReadFrame(big)
		require.NoError(t, err)
		require.Equal(t, wire.FrameMessage, kind)
		require.NoError(t, proto.Unmarshal(p, &m))
		require.NotNil(t, m.GetRegistered(), "%v", &m)
	}
	require.Equal(t, "2", r.streams(t))
}
