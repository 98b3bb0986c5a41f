package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// helperEnv makes the test binary act as a small etcd client instead of
// running tests. The test process lives in the root network namespace,
// which cannot reach the hosts' addresses, so it reads etcd by running
// itself inside a host.
const helperEnv = "RDZV_E2E_HELPER"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// etcdKV is what the etcd-get helper prints, one JSON array of them.
type etcdKV struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

func helperMain(mode string, args []string) int {
	switch {
	case mode == "etcd-get" && (len(args) == 2 || len(args) == 5):
		if err := etcdGet(args[0], args[1], args[2:]...); err != nil {
			fmt.Fprintf(os.Stderr, "etcd-get: %v\n", err)
			return 1
		}
		return 0
	case mode == "etcd-rbac" && len(args) == 5:
		if err := etcdRBAC(args[0], args[1:4], args[4]); err != nil {
			fmt.Fprintf(os.Stderr, "etcd-rbac: %v\n", err)
			return 1
		}
		return 0
	case mode == "http-get" && len(args) == 1:
		if err := httpGet(args[0]); err != nil {
			fmt.Fprintf(os.Stderr, "http-get: %v\n", err)
			return 1
		}
		return 0
	case mode == "local-attacker" && len(args) >= 1:
		if err := json.NewEncoder(os.Stdout).Encode(attack(args[0], args[1:])); err != nil {
			fmt.Fprintf(os.Stderr, "local-attacker: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "usage: %[1]s=etcd-get %[2]s ENDPOINT PREFIX [CA CERT KEY]\n"+
		"       %[1]s=etcd-rbac %[2]s ENDPOINT CA CERT KEY USER\n"+
		"       %[1]s=http-get %[2]s URL\n"+
		"       %[1]s=local-attacker %[2]s SOCKET [PATH...]\n", helperEnv, os.Args[0])
	return 2
}

// etcdClient connects to endpoint, with the client certificate of tlsFiles
// (CA, cert, key) when given.
func etcdClient(endpoint string, tlsFiles ...string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if len(tlsFiles) == 3 {
		tlsCfg, err := (transport.TLSInfo{TrustedCAFile: tlsFiles[0], CertFile: tlsFiles[1], KeyFile: tlsFiles[2]}).ClientConfig()
		if err != nil {
			return nil, err
		}
		cfg.TLS = tlsCfg
	}
	return clientv3.New(cfg)
}

// etcdRBAC sets up what docs/security.md#etcd asks of an external cluster: a root
// user, a role that may use /rdzv/v1/ only, user (a client certificate's
// common name) with that role, and authentication on. It connects with
// the certificate of tlsFiles, which may do anything until then.
func etcdRBAC(endpoint string, tlsFiles []string, user string) error {
	cli, err := etcdClient(endpoint, tlsFiles...)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	steps := []func() error{
		func() error { _, err := cli.UserAdd(ctx, "root", "e2e-root-password"); return err },
		func() error { _, err := cli.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := cli.RoleAdd(ctx, "rdzv"); return err },
		func() error {
			_, err := cli.RoleGrantPermission(ctx, "rdzv", "/rdzv/v1/", clientv3.GetPrefixRangeEnd("/rdzv/v1/"), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error {
			_, err := cli.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		},
		func() error { _, err := cli.UserGrantRole(ctx, user, "rdzv"); return err },
		func() error { _, err := cli.AuthEnable(ctx); return err },
	}
	for i, step := range steps {
		if err := step(); err != nil {
			return fmt.Errorf("step %d: %w", i+1, err)
		}
	}
	return nil
}

// attackResult is what the local-attacker helper got: the error of each
// attempt, "" where it succeeded.
type attackResult struct {
	// Connect is connecting to the etcd socket; ConnectDenied is set when
	// the kernel refused it for want of permission.
	Connect       string `json:"connect"`
	ConnectDenied bool   `json:"connect_denied"`
	// Get lists every key; Keys are those it got.
	Get  string   `json:"get"`
	Keys []string `json:"keys"`
	// Values are what the keys under /rdzv/v1/jobs/ hold.
	Values []string `json:"values"`
	// Put writes a job record of the attacker's.
	Put string `json:"put"`
	// Read is reading each path given (a directory is listed).
	Read map[string]string `json:"read"`
}

// attack tries, as whoever runs it, to use the etcd at socket and to read
// paths.
func attack(socket string, paths []string) attackResult {
	var r attackResult
	errText := func(err error) string {
		if err == nil {
			return ""
		}
		return err.Error()
	}
	conn, err := net.Dial("unix", socket)
	if err == nil {
		_ = conn.Close()
	}
	r.Connect, r.ConnectDenied = errText(err), errors.Is(err, syscall.EACCES)

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"unix://" + socket}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		r.Get, r.Put = err.Error(), err.Error()
	} else {
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		resp, err := cli.Get(ctx, "/", clientv3.WithPrefix())
		cancel()
		r.Get = errText(err)
		if err == nil {
			for _, kv := range resp.Kvs {
				r.Keys = append(r.Keys, string(kv.Key))
				if strings.HasPrefix(string(kv.Key), "/rdzv/v1/jobs/") {
					r.Values = append(r.Values, string(kv.Value))
				}
			}
		}
		ctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
		_, err = cli.Put(ctx, "/rdzv/v1/jobs/planted", "attacker's job")
		cancel()
		r.Put = errText(err)
	}

	r.Read = map[string]string{}
	for _, p := range paths {
		if info, err := os.Stat(p); err == nil && info.IsDir() {
			_, err = os.ReadDir(p)
			r.Read[p] = errText(err)
			continue
		}
		_, err := os.ReadFile(p)
		r.Read[p] = errText(err)
	}
	return r
}

// httpGet prints the body of url, which must answer 200: a daemon's
// metrics or health, served on its host's loopback.
func httpGet(url string) error {
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	_, err = os.Stdout.Write(body)
	return err
}

func etcdGet(endpoint, prefix string, tlsFiles ...string) error {
	cli, err := etcdClient(endpoint, tlsFiles...)
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("get %s: %w", prefix, err)
	}
	kvs := make([]etcdKV, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		kvs = append(kvs, etcdKV{Key: string(kv.Key), Value: kv.Value})
	}
	return json.NewEncoder(os.Stdout).Encode(kvs)
}
