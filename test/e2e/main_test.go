package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

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
	if mode != "etcd-get" || len(args) != 2 {
		fmt.Fprintf(os.Stderr, "usage: %s=etcd-get %s ENDPOINT PREFIX\n", helperEnv, os.Args[0])
		return 2
	}
	if err := etcdGet(args[0], args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "etcd-get: %v\n", err)
		return 1
	}
	return 0
}

func etcdGet(endpoint, prefix string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
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
