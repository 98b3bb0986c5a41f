package agent

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	rdzvv1 "github.com/rdzv/rdzv/proto/rdzv/v1"
	"github.com/rdzv/rdzv/wire"
)

// controllers picks the controller the session connects to: the leader a
// standby named, else the configured addresses in turn. Only the session
// loop uses it.
type controllers struct {
	addrs []string
	// creds is the transport security for one address: TLS checks that the
	// controller's certificate names the host dialled.
	creds func(addr string) (credentials.TransportCredentials, error)
	opts  []grpc.DialOption
	conns map[string]*grpc.ClientConn
	next  int
	// hint is the leader a standby named on the last attempt.
	hint string
	// hops counts redirects in a row, so that two controllers naming each
	// other during an election cannot keep the agent bouncing.
	hops int
}

// maxHops bounds redirects followed without a backoff in between.
const maxHops = 3

func newControllers(addrs []string, creds func(addr string) (credentials.TransportCredentials, error), opts ...grpc.DialOption) *controllers {
	return &controllers{addrs: addrs, creds: creds, opts: opts, conns: map[string]*grpc.ClientConn{}}
}

// pick is the address to try next and a client for it.
func (c *controllers) pick() (string, rdzvv1.AgentServiceClient, error) {
	addr := c.hint
	if addr == "" {
		addr = c.addrs[c.next%len(c.addrs)]
	}
	cc := c.conns[addr]
	if cc == nil {
		creds, err := c.creds(addr)
		if err != nil {
			return addr, nil, err
		}
		if cc, err = grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, c.opts...)...); err != nil {
			return addr, nil, err
		}
		c.conns[addr] = cc
	}
	return addr, rdzvv1.NewAgentServiceClient(cc), nil
}

// failed records how the session with addr ended and reports whether a
// standby redirected to another address, to be tried at once. Otherwise
// the next attempt goes to the next configured address, so a dead leader
// is not retried forever.
func (c *controllers) failed(addr string, err error) (redirected bool) {
	if status.Code(err) == codes.Unauthenticated {
		// The controller refused the certificate this connection was
		// opened with, and every call on it would be refused alike: the
		// next attempt handshakes anew, with the certificate on disk then
		// (renewed, one hopes).
		if cc := c.conns[addr]; cc != nil {
			_ = cc.Close()
			delete(c.conns, addr)
		}
	}
	reason, leader, _ := wire.Parse(err)
	if reason == wire.ReasonNotLeader && leader != "" && leader != addr && c.hops < maxHops {
		c.hint = leader
		c.hops++
		return true
	}
	c.hops = 0
	if c.hint == "" {
		c.next++
	}
	c.hint = ""
	return false
}

func (c *controllers) close() {
	for _, cc := range c.conns {
		_ = cc.Close()
	}
}
