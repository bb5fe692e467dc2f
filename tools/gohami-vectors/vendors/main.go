// Command vendors hands the inputs of cases.json to Go HAMi's own device functions for the
// vendors this project models besides NVIDIA (Cambricon MLU as Go HAMi 2.10 reads it from
// kubelet capacity, Hygon DCU): how a Node's devices are read (GetNodeDevices), whether the
// webhook takes a container and what it asks for (MutateAdmission, GenerateResourceRequests)
// and the pod annotations a decision writes (PatchAnnotations). It writes what each returned,
// so that this project's readers and writers can be compared with Go HAMi case by case
// (tests/test_go_vendor_vectors.py). It is built against an unpacked Go HAMi tree by
// scripts/gen-go-vectors.sh; nothing of Go HAMi is copied into this repository.
//
//	vendors -cases cases.json -out vectors.json -commit <sha> -command "<how it was run>"
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/cambricon"
	"github.com/Project-HAMi/HAMi/pkg/device/hygon"
)

const functions = "CambriconDevices.GetNodeDevices, CambriconDevices.MutateAdmission, " +
	"CambriconDevices.GenerateResourceRequests, CambriconDevices.PatchAnnotations, " +
	"DCUDevices.GetNodeDevices, DCUDevices.MutateAdmission, " +
	"DCUDevices.GenerateResourceRequests, DCUDevices.PatchAnnotations"

type obj = map[string]any

// vendorDevices is the part of Go HAMi's device interface the file records.
type vendorDevices interface {
	GetNodeDevices(n corev1.Node) ([]*device.DeviceInfo, error)
	MutateAdmission(ctr *corev1.Container, p *corev1.Pod) (bool, error)
	GenerateResourceRequests(ctr *corev1.Container) device.ContainerDeviceRequest
	PatchAnnotations(pod *corev1.Pod, annoinput *map[string]string, pd device.PodDevices) map[string]string
}

type vendor struct {
	devices  vendorDevices
	typeWord string // Go's device type: the key of PodDevices
}

type podDevice struct {
	Idx       int    `json:"idx"`
	UUID      string `json:"uuid"`
	Type      string `json:"type"`
	Usedmem   int32  `json:"usedmem"`
	Usedcores int32  `json:"usedcores"`
}

type caseFile struct {
	Nodes []struct {
		Name   string          `json:"name"`
		Vendor string          `json:"vendor"`
		Node   json.RawMessage `json:"node"`
		// The cards' memory (MiB) of a node this project's agent serves; not read here.
		AgentCardsMiB []int `json:"agent_cards_mib,omitempty"`
	} `json:"nodes"`
	Containers []struct {
		Name      string          `json:"name"`
		Vendor    string          `json:"vendor"`
		Container json.RawMessage `json:"container"`
	} `json:"containers"`
	PodValues []struct {
		Name       string        `json:"name"`
		Vendor     string        `json:"vendor"`
		Containers [][]podDevice `json:"containers"`
	} `json:"pod_values"`
}

func main() {
	cases := flag.String("cases", "", "inputs (cases.json)")
	out := flag.String("out", "", "vectors file to write")
	commit := flag.String("commit", "", "Go HAMi commit the tree was unpacked from")
	command := flag.String("command", "", "the command that produced the file")
	goVersion := flag.String("go-version", "", "go version used")
	flag.Parse()
	// The device functions log every value they read; the file is the record.
	logFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(logFlags)
	for name, value := range map[string]string{"logtostderr": "false", "stderrthreshold": "FATAL"} {
		if err := logFlags.Set(name, value); err != nil {
			fmt.Fprintln(os.Stderr, "vendor vectors:", err)
			os.Exit(1)
		}
	}
	klog.SetOutput(io.Discard)
	if err := run(*cases, *out, *commit, *command, *goVersion); err != nil {
		fmt.Fprintln(os.Stderr, "vendor vectors:", err)
		os.Exit(1)
	}
}

func run(casesPath, outPath, commit, command, goVersion string) error {
	raw, err := os.ReadFile(casesPath)
	if err != nil {
		return err
	}
	var in caseFile
	if err := json.Unmarshal(raw, &in); err != nil {
		return err
	}
	// The device configuration of Go HAMi's Helm chart (values.yaml and the device
	// ConfigMap of charts/hami at this commit).
	cambriconConfig := cambricon.CambriconConfig{
		ResourceCountName:  "cambricon.com/vmlu",
		ResourceMemoryName: "cambricon.com/mlu.smlu.vmemory",
		ResourceCoreName:   "cambricon.com/mlu.smlu.vcore",
	}
	hygonConfig := hygon.HygonConfig{
		ResourceCountName:  "hygon.com/dcunum",
		ResourceMemoryName: "hygon.com/dcumem",
		ResourceCoreName:   "hygon.com/dcucores",
		MemoryFactor:       1,
	}
	vendors := map[string]vendor{
		"cambricon": {cambricon.InitMLUDevice(cambriconConfig), cambricon.CambriconMLUDevice},
		"hygon":     {hygon.InitDCUDevice(hygonConfig), hygon.HygonDCUDevice},
	}
	pick := func(name, what string) (vendor, error) {
		v, ok := vendors[name]
		if !ok {
			return vendor{}, fmt.Errorf("%s: unknown vendor %q", what, name)
		}
		return v, nil
	}

	file := obj{
		"about": obj{
			"functions": functions,
			"generated": time.Now().UTC().Format(time.RFC3339),
			"generator": "tools/gohami-vectors/vendors, this project's program calling the Go HAMi " +
				"functions listed in \"functions\" on the inputs of tools/gohami-vectors/vendors/cases.json",
			"command": command,
			"go":      goVersion,
			"hami":    commit,
			"config": obj{
				"cambricon": obj{"resourceCountName": cambriconConfig.ResourceCountName,
					"resourceMemoryName": cambriconConfig.ResourceMemoryName,
					"resourceCoreName":   cambriconConfig.ResourceCoreName},
				"hygon": obj{"resourceCountName": hygonConfig.ResourceCountName,
					"resourceMemoryName": hygonConfig.ResourceMemoryName,
					"resourceCoreName":   hygonConfig.ResourceCoreName,
					"memoryFactor":       hygonConfig.MemoryFactor},
			},
			"note": "every 'go' field is what HAMi's own function returned for the case's input",
		},
		"keys": obj{
			"cambricon_to_allocate": device.InRequestDevices[cambricon.CambriconMLUDevice],
			"cambricon_allocated":   device.SupportDevices[cambricon.CambriconMLUDevice],
			"cambricon_profile":     cambricon.DsmluProfile,
			"cambricon_assigned":    cambricon.DsmluResourceAssigned,
			"cambricon_lock":        cambricon.DsmluLockTime,
			"hygon_to_allocate":     device.InRequestDevices[hygon.HygonDCUDevice],
			"hygon_allocated":       device.SupportDevices[hygon.HygonDCUDevice],
			"hygon_register":        hygon.RegisterAnnos,
			"hygon_handshake":       hygon.HandshakeAnnos,
		},
	}

	var section []obj
	for _, c := range in.Nodes {
		v, err := pick(c.Vendor, c.Name)
		if err != nil {
			return err
		}
		var node corev1.Node
		if err := json.Unmarshal(c.Node, &node); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		list, err := v.devices.GetNodeDevices(node)
		got := obj{"devices": devicesOut(list)}
		if err != nil {
			got["error"] = err.Error()
		}
		item := obj{"name": c.Name, "vendor": c.Vendor, "node": c.Node, "go": got}
		if c.AgentCardsMiB != nil {
			item["agent_cards_mib"] = c.AgentCardsMiB
		}
		section = append(section, item)
	}
	file["nodes"], section = section, nil

	for _, c := range in.Containers {
		v, err := pick(c.Vendor, c.Name)
		if err != nil {
			return err
		}
		var ctr corev1.Container
		if err := json.Unmarshal(c.Container, &ctr); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{ctr}}}
		found, mutateErr := v.devices.MutateAdmission(&pod.Spec.Containers[0], pod)
		request := v.devices.GenerateResourceRequests(&ctr)
		got := obj{
			"mutate": found,
			"request": obj{
				"nums": request.Nums, "type": request.Type, "memreq": request.Memreq,
				"mempercentagereq": request.MemPercentagereq, "coresreq": request.Coresreq,
			},
		}
		if mutateErr != nil {
			got["mutate_error"] = mutateErr.Error()
		}
		section = append(section, obj{"name": c.Name, "vendor": c.Vendor, "container": c.Container, "go": got})
	}
	file["containers"], section = section, nil

	for _, c := range in.PodValues {
		v, err := pick(c.Vendor, c.Name)
		if err != nil {
			return err
		}
		single := device.PodSingleDevice{}
		for _, devices := range c.Containers {
			ctr := device.ContainerDevices{}
			for _, d := range devices {
				ctr = append(ctr, device.ContainerDevice{
					Idx: d.Idx, UUID: d.UUID, Type: d.Type, Usedmem: d.Usedmem, Usedcores: d.Usedcores,
				})
			}
			single = append(single, ctr)
		}
		annotations := map[string]string{}
		v.devices.PatchAnnotations(&corev1.Pod{}, &annotations, device.PodDevices{v.typeWord: single})
		section = append(section, obj{
			"name": c.Name, "vendor": c.Vendor, "containers": c.Containers,
			"go": obj{"annotations": annotations},
		})
	}
	file["pod_values"] = section

	data, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(data, '\n'), 0o644)
}

func devicesOut(list []*device.DeviceInfo) []obj {
	out := []obj{}
	for _, d := range list {
		out = append(out, obj{
			"id": d.ID, "index": d.Index, "count": d.Count, "devmem": d.Devmem, "devcore": d.Devcore,
			"type": d.Type, "numa": d.Numa, "health": d.Health, "mode": d.Mode,
			"devicevendor": d.DeviceVendor,
		})
	}
	return out
}
