// The command line every generator here takes, in one place: scripts/gen-go-vectors.sh
// copies this file beside each generator's main.go (one package main per work module).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"k8s.io/klog/v2"
)

// generate turns the input file into the vectors file, recording where it came from.
type generate func(inputPath, outPath, commit, command, goVersion string) error

// runGenerator parses the flags the script passes, runs generate and exits 1 (naming the
// generator) on an error. quietKlog keeps Go HAMi's own logging of every value it reads
// off stderr: the vectors file is the record, only fatal errors are shown.
func runGenerator(name, inputFlag, inputHelp string, quietKlog bool, run generate) {
	input := flag.String(inputFlag, "", inputHelp)
	out := flag.String("out", "", "vectors file to write")
	commit := flag.String("commit", "", "Go HAMi commit the tree was unpacked from")
	command := flag.String("command", "", "the command that produced the file")
	goVersion := flag.String("go-version", "", "go version used")
	flag.Parse()
	if quietKlog {
		logFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(logFlags)
		for key, value := range map[string]string{"logtostderr": "false", "stderrthreshold": "FATAL"} {
			if err := logFlags.Set(key, value); err != nil {
				fmt.Fprintln(os.Stderr, name+":", err)
				os.Exit(1)
			}
		}
		klog.SetOutput(io.Discard)
	}
	if err := run(*input, *out, *commit, *command, *goVersion); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// readJSON decodes the generator's input file into v.
func readJSON(path string, v any) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}
