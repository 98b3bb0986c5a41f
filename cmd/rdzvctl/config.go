package main

// Named contexts: a config file names the clusters an operator works with,
// each with its controllers and the directory of the operator's
// certificate for it, and which one is current. A setting comes from,
// strongest first: its flag, its environment variable, the context, the
// default.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/rdzv/rdzv/client"
	"github.com/rdzv/rdzv/wire"
)

// maxConfigBytes bounds the config file.
const maxConfigBytes = 1 << 20

// cliConfig is the config file.
type cliConfig struct {
	// CurrentContext is used when neither --context nor RDZV_CONTEXT
	// names one; empty: none.
	CurrentContext string           `yaml:"current_context" json:"current_context"`
	Contexts       []clusterContext `yaml:"contexts" json:"contexts"`
}

// clusterContext is one cluster: what --controller, --tls-dir, --insecure
// and --timeout would say. Empty fields leave the flags' defaults.
type clusterContext struct {
	Name       string        `yaml:"name" json:"name"`
	Controller string        `yaml:"controller" json:"controller,omitempty"`
	TLSDir     string        `yaml:"tls_dir" json:"tls_dir,omitempty"`
	Insecure   bool          `yaml:"insecure" json:"insecure,omitempty"`
	Timeout    time.Duration `yaml:"timeout" json:"timeout"`
}

// DefaultConfig is the config of an operator without a config file: no
// contexts.
func DefaultConfig() *cliConfig { return &cliConfig{} }

// Validate checks the contexts, naming each bad field by its path.
func (c *cliConfig) Validate() error { return joinFieldErrors(c.problems()) }

func (c *cliConfig) problems() []*wire.FieldError {
	var errs []*wire.FieldError
	seen := map[string]bool{}
	for i, cc := range c.Contexts {
		field := fmt.Sprintf("contexts[%d]", i)
		switch fe := wire.ValidateName(field+".name", cc.Name); {
		case fe != nil:
			errs = append(errs, fe)
		case seen[cc.Name]:
			errs = append(errs, &wire.FieldError{Field: field + ".name", Value: wire.Quote(cc.Name), Reason: "names two contexts"})
		}
		seen[cc.Name] = true
		if cc.Controller != "" {
			if _, err := client.ParseAddrs(field+".controller", cc.Controller); err != nil {
				errs = append(errs, &wire.FieldError{Field: field + ".controller", Value: wire.Quote(cc.Controller), Reason: "want host:port, or several: host:port,host:port"})
			}
		}
		if cc.Timeout < 0 {
			errs = append(errs, &wire.FieldError{Field: field + ".timeout", Value: cc.Timeout.String(), Reason: "must be positive"})
		}
	}
	if c.CurrentContext != "" && !seen[c.CurrentContext] {
		errs = append(errs, &wire.FieldError{Field: "current_context", Value: wire.Quote(c.CurrentContext), Reason: "not a context; have " + c.names()})
	}
	return errs
}

func joinFieldErrors(fes []*wire.FieldError) error {
	errs := make([]error, len(fes))
	for i, fe := range fes {
		errs[i] = fe
	}
	return errors.Join(errs...)
}

func (c *cliConfig) names() string {
	var names []string
	for _, cc := range c.Contexts {
		names = append(names, cc.Name)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

func (c *cliConfig) find(name string) (*clusterContext, bool) {
	for i := range c.Contexts {
		if c.Contexts[i].Name == name {
			return &c.Contexts[i], true
		}
	}
	return nil, false
}

// configPath is --config, $RDZV_CONFIG, or rdzv/config.yaml in the user's
// config directory ($XDG_CONFIG_HOME or ~/.config).
func (c *command) configPath() (string, error) {
	if c.configFile != "" {
		return c.configFile, nil
	}
	if p := os.Getenv("RDZV_CONFIG"); p != "" {
		return p, nil
	}
	dir, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("finding the config file: %w; pass --config or set RDZV_CONFIG", err)
	}
	return filepath.Join(dir, "rdzv", "config.yaml"), nil
}

// readConfig is the config file rdzvctl uses (configPath), read with
// loadConfig.
func (c *command) readConfig() (path string, cfg *cliConfig, doc *yaml.Node, err error) {
	if path, err = c.configPath(); err != nil {
		return "", nil, nil, err
	}
	cfg, doc, err = loadConfig(path)
	return path, cfg, doc, err
}

// loadConfig reads the config file strictly: an unknown field, a value of
// the wrong kind or a bad one is an error at its line and column. A
// missing file is the default config; doc is nil then.
func loadConfig(path string) (cfg *cliConfig, doc *yaml.Node, err error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return DefaultConfig(), nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the config file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, nil, fmt.Errorf("reading the config file: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, nil, fmt.Errorf("%s: more than %d bytes", path, maxConfigBytes)
	}
	cfg, doc, err = parseConfig(data)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, doc, nil
}

// parseConfig decodes a config file; see loadConfig.
func parseConfig(data []byte) (*cliConfig, *yaml.Node, error) {
	doc := &yaml.Node{}
	if err := yaml.Unmarshal(data, doc); err != nil {
		return nil, nil, fmt.Errorf("not valid YAML: %w", err)
	}
	cfg := DefaultConfig()
	if len(doc.Content) == 0 {
		return cfg, doc, nil
	}
	pos := map[string]*yaml.Node{}
	if errs := checkFields(doc.Content[0], reflect.TypeOf(*cfg), "", pos); len(errs) > 0 {
		return nil, nil, joinFieldErrors(errs)
	}
	if err := doc.Content[0].Decode(cfg); err != nil {
		return nil, nil, err // yaml.v3 says at which line
	}
	errs := cfg.problems()
	for _, fe := range errs {
		if n, ok := pos[fe.Field]; ok {
			fe.Line, fe.Column = n.Line, n.Column
		}
	}
	if len(errs) > 0 {
		return nil, nil, joinFieldErrors(errs)
	}
	return cfg, doc, nil
}

// checkFields refuses a mapping key that t has no field for, at its line
// and column, and records where each field is (pos, by path).
func checkFields(n *yaml.Node, t reflect.Type, path string, pos map[string]*yaml.Node) []*wire.FieldError {
	pos[path] = n
	var errs []*wire.FieldError
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		var known []string
		for i := range t.NumField() {
			known = append(known, strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0])
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, field := n.Content[i], join(path, n.Content[i].Value)
			j := slices.Index(known, key.Value)
			if j < 0 {
				errs = append(errs, &wire.FieldError{Field: field, Reason: "unknown field; want one of " + strings.Join(known, ", "), Line: key.Line, Column: key.Column})
				continue
			}
			errs = append(errs, checkFields(n.Content[i+1], t.Field(j).Type, field, pos)...)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for i, item := range n.Content {
			errs = append(errs, checkFields(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i), pos)...)
		}
	}
	return errs // a scalar, or the wrong kind: Decode says which
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// contextName is the context chosen: --context, $RDZV_CONTEXT or the
// file's current_context.
func (c *command) contextName(cfg *cliConfig) string {
	for _, name := range []string{c.context, os.Getenv("RDZV_CONTEXT")} {
		if name != "" {
			return name
		}
	}
	return cfg.CurrentContext
}

// applyContext fills in the settings neither a flag nor the environment
// gave from the context chosen, once, before rdzvctl talks to a
// controller.
func (c *command) applyContext() error {
	if c.contextDone {
		return nil
	}
	c.contextDone = true
	path, cfg, _, err := c.readConfig()
	if err != nil {
		return err
	}
	name := c.contextName(cfg)
	if name == "" {
		return nil
	}
	cc, ok := cfg.find(name)
	if !ok {
		return fmt.Errorf("%w: context %q is not in %s; have %s (rdzvctl config get-contexts)", errUsage, name, path, cfg.names())
	}
	unset := func(flag, env string) bool {
		return (c.flags == nil || !c.flags.Changed(flag)) && (env == "" || os.Getenv(env) == "")
	}
	if cc.Controller != "" && unset("controller", "RDZV_CONTROLLER") {
		c.controller, c.controllerContext = cc.Controller, name
	}
	if cc.TLSDir != "" && unset("tls-dir", "RDZV_TLS_DIR") {
		c.tlsDir = expandPath(cc.TLSDir, filepath.Dir(path))
	}
	if cc.Insecure && unset("insecure", "") {
		c.insecure = true
	}
	if cc.Timeout > 0 && unset("timeout", "") {
		c.timeout = cc.Timeout
	}
	return nil
}

// expandPath resolves ~/ against the home directory and a relative path
// against base (the config file's directory).
func expandPath(p, base string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(base, p)
}

// configCmd is `rdzvctl config`: the contexts of the config file.
func (c *command) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Named contexts: the clusters rdzvctl talks to",
		Long: `The config file (--config, $RDZV_CONFIG, or rdzv/config.yaml in
$XDG_CONFIG_HOME or ~/.config) names contexts, each a cluster's controllers
and the directory of the operator's certificate for it, and the current
one:

  current_context: prod
  contexts:
    - name: prod
      controller: ctl-1.example:7070,ctl-2.example:7070
      tls_dir: ~/.rdzv/prod        # ca.crt, rdzvctl.crt, rdzvctl.key
    - name: lab
      controller: 127.0.0.1:7070
      insecure: true
      timeout: 30s

--context or $RDZV_CONTEXT chooses another context for one command. A
setting comes from, strongest first: its flag, its environment variable
(RDZV_CONTROLLER, RDZV_TLS_DIR), the context, the default. A relative
tls_dir is relative to the config file's directory.`,
		Example: `  rdzvctl config set-context prod --controller ctl-1:7070,ctl-2:7070 --tls-dir ~/.rdzv/prod
  rdzvctl config use-context prod
  rdzvctl config get-contexts
  rdzvctl --context lab list`,
		Args: commandArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("%w: config takes get-contexts, current-context, use-context or set-context", errUsage)
		},
	}
	cmd.AddCommand(c.getContextsCmd(), c.currentContextCmd(), c.useContextCmd(), c.setContextCmd())
	return cmd
}

func (c *command) getContextsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "get-contexts",
		Short:   "List the config file's contexts; * marks the one in use",
		Example: "  rdzvctl config get-contexts\n  rdzvctl config get-contexts -o name",
		Args:    exactArgs(0, "config get-contexts takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := c.format()
			if err != nil {
				return err
			}
			_, cfg, _, err := c.readConfig()
			if err != nil {
				return err
			}
			return printContexts(c.out, o, cfg, c.contextName(cfg))
		},
	}
	return prints(cmd, allOutputs...)
}

func (c *command) currentContextCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "current-context",
		Short: "Print the context in use (--context, $RDZV_CONTEXT or the file's current_context)",
		Args:  exactArgs(0, "config current-context takes no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			path, cfg, _, err := c.readConfig()
			if err != nil {
				return err
			}
			name := c.contextName(cfg)
			if name == "" {
				return fmt.Errorf("no context is in use: %s sets no current_context (rdzvctl config use-context NAME)", path)
			}
			if _, ok := cfg.find(name); !ok {
				return fmt.Errorf("context %q is not in %s; have %s", name, path, cfg.names())
			}
			_, err = fmt.Fprintln(c.out, name)
			return err
		},
	}
}

func (c *command) useContextCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "use-context NAME",
		Short:   "Make a context the current one (current_context in the config file)",
		Example: "  rdzvctl config use-context prod",
		Args:    exactArgs(1, "config use-context takes one context name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.editConfig(func(cfg *cliConfig, root *yaml.Node) error {
				if _, ok := cfg.find(args[0]); !ok {
					return fmt.Errorf("%w: context %q is not in the config file; have %s (rdzvctl config set-context NAME --controller ...)", errUsage, args[0], cfg.names())
				}
				setKey(root, "current_context", args[0])
				fmt.Fprintf(c.out, "now using context %s\n", args[0])
				return nil
			})
		},
	}
}

// contextFlags are the global flags set-context writes into a context.
var contextFlags = []struct{ flag, key string }{
	{"controller", "controller"}, {"tls-dir", "tls_dir"}, {"insecure", "insecure"}, {"timeout", "timeout"},
}

func (c *command) setContextCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "set-context NAME [--controller ADDRS] [--tls-dir DIR] [--insecure] [--timeout D]",
		Short: "Add a context, or change one, from the flags given",
		Long: `Add a context to the config file, or change one: each of --controller,
--tls-dir, --insecure and --timeout given is written into it (the file is
created if need be; its comments are kept).`,
		Example: `  rdzvctl config set-context prod --controller ctl-1:7070,ctl-2:7070 --tls-dir ~/.rdzv/prod
  rdzvctl config set-context lab --controller 127.0.0.1:7070 --insecure`,
		Args: exactArgs(1, "config set-context takes one context name"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fe := wire.ValidateName("context name", args[0]); fe != nil {
				return fmt.Errorf("%w: %w", errUsage, fe)
			}
			var given []*pflag.Flag
			for _, f := range contextFlags {
				if fl := c.flags.Lookup(f.flag); fl.Changed {
					given = append(given, fl)
				}
			}
			if len(given) == 0 {
				return fmt.Errorf("%w: config set-context: give what to set: --controller, --tls-dir, --insecure or --timeout", errUsage)
			}
			return c.editConfig(func(cfg *cliConfig, root *yaml.Node) error {
				ctx := contextNode(root, args[0])
				for _, f := range contextFlags {
					fl := c.flags.Lookup(f.flag)
					if !fl.Changed {
						continue
					}
					value := fl.Value.String()
					if f.flag == "tls-dir" && !filepath.IsAbs(value) && !strings.HasPrefix(value, "~/") {
						// Given here relative to the working directory; the
						// file's are relative to its own.
						abs, err := filepath.Abs(value)
						if err != nil {
							return fmt.Errorf("--tls-dir: %w", err)
						}
						value = abs
					}
					setKey(ctx, f.key, value)
				}
				verb := "changed"
				if _, ok := cfg.find(args[0]); !ok {
					verb = "added"
				}
				fmt.Fprintf(c.out, "context %s %s\n", args[0], verb)
				return nil
			})
		},
	}
}

// editConfig changes the config file's YAML in place with edit (its
// comments are kept), checks the result as loadConfig would, and writes
// it back atomically; the file is created if it is missing.
func (c *command) editConfig(edit func(cfg *cliConfig, root *yaml.Node) error) error {
	path, cfg, doc, err := c.readConfig()
	if err != nil {
		return err
	}
	if doc == nil || len(doc.Content) == 0 {
		doc = &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
	}
	if err := edit(cfg, doc.Content[0]); err != nil {
		return err
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	if _, _, err := parseConfig(b.Bytes()); err != nil {
		return fmt.Errorf("%w: the config file would not be valid: %w", errUsage, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".config-*.yaml")
	if err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there
	_, err = tmp.Write(b.Bytes())
	if err := errors.Join(err, tmp.Close()); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing the config file: %w", err)
	}
	return nil
}

// keyIndex is the index of key's node in mapping m, or -1.
func keyIndex(m *yaml.Node, key string) int {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return i
		}
	}
	return -1
}

// setKey sets key to value in mapping m (a scalar for a string), adding
// the key if missing and keeping the comments of a value it replaces.
func setKey(m *yaml.Node, key string, value any) {
	v, ok := value.(*yaml.Node)
	if !ok {
		v = &yaml.Node{Kind: yaml.ScalarNode, Value: fmt.Sprint(value)}
	}
	i := keyIndex(m, key)
	if i < 0 {
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
		return
	}
	v.HeadComment, v.LineComment = m.Content[i+1].HeadComment, m.Content[i+1].LineComment
	m.Content[i+1] = v
}

// contextNode is the mapping of the context named name in root, added if
// missing.
func contextNode(root *yaml.Node, name string) *yaml.Node {
	var list *yaml.Node
	if i := keyIndex(root, "contexts"); i >= 0 && root.Content[i+1].Kind == yaml.SequenceNode {
		list = root.Content[i+1]
	} else {
		list = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		setKey(root, "contexts", list)
	}
	for _, item := range list.Content {
		if i := keyIndex(item, "name"); i >= 0 && item.Content[i+1].Value == name {
			return item
		}
	}
	item := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
	setKey(item, "name", name)
	list.Content = append(list.Content, item)
	return item
}

// printContexts prints the contexts, current the one in use.
func printContexts(w io.Writer, o output, cfg *cliConfig, current string) error {
	switch o.kind {
	case "name":
		for _, cc := range cfg.Contexts {
			fmt.Fprintln(w, cc.Name)
		}
		return nil
	case "table", "wide":
		t := table(w)
		header := "CURRENT\tNAME\tCONTROLLER\tTLS DIR"
		if o.kind == "wide" {
			header += "\tINSECURE\tTIMEOUT"
		}
		fmt.Fprintln(t, header)
		for _, cc := range cfg.Contexts {
			mark := ""
			if cc.Name == current {
				mark = "*"
			}
			fmt.Fprintf(t, "%s\t%s\t%s\t%s", mark, cc.Name, orDash(cc.Controller), orDash(cc.TLSDir))
			if o.kind == "wide" {
				timeout := "-"
				if cc.Timeout > 0 {
					timeout = cc.Timeout.String()
				}
				fmt.Fprintf(t, "\t%t\t%s", cc.Insecure, timeout)
			}
			fmt.Fprintln(t)
		}
		return t.Flush()
	}
	// Durations as Go durations, as in the file.
	type jsonContext struct {
		clusterContext
		Timeout string `json:"timeout,omitempty"`
	}
	doc := struct {
		CurrentContext string        `json:"current_context"`
		Contexts       []jsonContext `json:"contexts"`
	}{CurrentContext: current, Contexts: []jsonContext{}}
	for _, cc := range cfg.Contexts {
		jc := jsonContext{clusterContext: cc}
		if cc.Timeout > 0 {
			jc.Timeout = cc.Timeout.String()
		}
		doc.Contexts = append(doc.Contexts, jc)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return printStructured(w, o, b)
}
