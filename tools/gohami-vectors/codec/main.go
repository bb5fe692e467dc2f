// Command codec hands the inputs of cases.json to Go HAMi's own annotation codecs (node
// register JSON and comma forms, NVIDIA's register reader, pod devices, node lock, handshake
// health check) and writes what each returned, so that this project's readers and writers
// can be compared with Go HAMi case by case (tests/test_go_vectors.py). It is built against
// an unpacked Go HAMi tree by scripts/gen-go-vectors.sh; nothing of Go HAMi is copied into
// this repository.
//
//	codec -cases cases.json -out vectors.json -commit <sha> -command "<how it was run>"
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/cambricon"
	"github.com/Project-HAMi/HAMi/pkg/device/nvidia"
	"github.com/Project-HAMi/HAMi/pkg/util"
	"github.com/Project-HAMi/HAMi/pkg/util/client"
	"github.com/Project-HAMi/HAMi/pkg/util/nodelock"
)

// The functions whose answers the file records, as "about.functions" names them.
const functions = "device.UnMarshalNodeDevices, device.MarshalNodeDevices, " +
	"NvidiaGPUDevices.GetNodeDevices, device.DecodeNodeDevices, device.EncodeNodeDevices, " +
	"device.EncodePodSingleDevice, device.EncodePodDevices, device.DecodePodDevices, " +
	"device.DecodeContainerDevices, nodelock.ParseNodeLock, nodelock.GenerateNodeLockKeyByPod, " +
	"device.CheckHealth, NvidiaGPUDevices.CheckHealth"

const nodeName = "go-node"

type obj = map[string]any

type podDevice struct {
	UUID      string `json:"uuid"`
	Type      string `json:"type"`
	Usedmem   int32  `json:"usedmem"`
	Usedcores int32  `json:"usedcores"`
}

// caseFile is cases.json: per section, the inputs of each case. Devices are read with Go
// HAMi's own JSON tags (id, index, count, devmem, devcore, type, numa, mode, migProfiles,
// health), so they are exactly what its functions get.
type caseFile struct {
	RegisterJSONDecode []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"register_json_decode"`
	RegisterGetNodeDevices []struct {
		Name string `json:"name"`
	} `json:"register_getnodedevices"`
	RegisterLegacyDecode []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"register_legacy_decode"`
	RegisterJSONEncode []struct {
		Name    string               `json:"name"`
		Devices []*device.DeviceInfo `json:"devices"`
	} `json:"register_json_encode"`
	RegisterLegacyEncode []struct {
		Name    string               `json:"name"`
		Devices []*device.DeviceInfo `json:"devices"`
	} `json:"register_legacy_encode"`
	// Values this project's seed writer writes for the devices, read by Go's readers.
	RegisterPythonForm []struct {
		Name    string               `json:"name"`
		Devices []*device.DeviceInfo `json:"devices"`
		Value   string               `json:"value"`
	} `json:"register_python_form"`
	PodDevicesDecode []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"pod_devices_decode"`
	PodDevicesEncode []struct {
		Name       string                   `json:"name"`
		Containers map[string][][]podDevice `json:"containers"`
	} `json:"pod_devices_encode"`
	Handshake []struct {
		Name        string  `json:"name"`
		Value       *string `json:"value"` // null: no handshake annotation
		Allocatable int64   `json:"allocatable"`
	} `json:"handshake"`
	NodeLockParse []struct {
		Name  string `json:"name"`
		Value string `json:"value"`
	} `json:"node_lock_parse"`
	NodeLockGenerate []struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		Pod       string `json:"pod"`
		ZoneOffS  int    `json:"zone_offset_s"`
	} `json:"node_lock_generate"`
}

func main() {
	runGenerator("codec vectors", "cases", "inputs (cases.json)", true, run)
}

func run(casesPath, outPath, commit, command, goVersion string) error {
	var in caseFile
	if err := readJSON(casesPath, &in); err != nil {
		return err
	}
	// Handshake stamps are read and written in the process zone: UTC, as in a cluster.
	time.Local = time.UTC
	gpuConfig := nvidia.NvidiaConfig{ResourceCountName: "nvidia.com/gpu"}
	nvidia.InitNvidiaDevice(gpuConfig) // registers NVIDIA's keys with pkg/device and pkg/util
	cambricon.InitMLUDevice(cambricon.CambriconConfig{ResourceCountName: "cambricon.com/vmlu"})

	file := obj{
		"about": obj{
			"functions": functions,
			"generated": time.Now().UTC().Format(time.RFC3339),
			"generator": "tools/gohami-vectors/codec, this project's program calling the Go HAMi " +
				"functions listed in \"functions\" on the inputs of tools/gohami-vectors/codec/cases.json",
			"command": command,
			"go":      goVersion,
			"hami":    commit,
			"keys_source": "constants in pkg/util/types.go, pkg/device/nvidia/device.go, " +
				"pkg/device/cambricon/device.go, pkg/util/nodelock/nodelock.go",
			"note": "every 'go' field is what HAMi's own function returned; 'value' is Go's output " +
				"in the encode sections and the input elsewhere (register_python_form: what this " +
				"project's seed writer writes)",
			"tz": "UTC (process), lock cases also in the fixed zone each names",
		},
		"keys": obj{
			"bind_phase":         util.DeviceBindPhase,
			"bind_time":          util.BindTimeAnnotations,
			"node_lock":          nodelock.NodeLockKey,
			"nvidia_allocated":   device.SupportDevices[nvidia.NvidiaGPUDevice],
			"nvidia_handshake":   util.HandshakeAnnos[nvidia.NvidiaGPUDevice],
			"nvidia_register":    nvidia.RegisterAnnos,
			"nvidia_to_allocate": device.InRequestDevices[nvidia.NvidiaGPUDevice],
			"nvidia_vendor_word": nvidia.NvidiaGPUDevice,
			"vgpu_node":          util.AssignedNodeAnnotations,
			"vgpu_time":          util.AssignedTimeAnnotations,
		},
	}

	var section []obj
	for _, c := range in.RegisterJSONDecode {
		list, err := device.UnMarshalNodeDevices(c.Value)
		section = append(section, obj{
			"name": c.Name, "value": c.Value,
			"go":                       deviceResult(list, err),
			"go_nvidia_getnodedevices": getNodeDevices(gpuConfig, &c.Value),
		})
	}
	file["register_json_decode"], section = section, nil
	for _, c := range in.RegisterGetNodeDevices {
		section = append(section, obj{"name": c.Name, "go_nvidia_getnodedevices": getNodeDevices(gpuConfig, nil)})
	}
	file["register_getnodedevices"], section = section, nil
	for _, c := range in.RegisterLegacyDecode {
		list, err := device.DecodeNodeDevices(c.Value)
		section = append(section, obj{"name": c.Name, "value": c.Value, "go": deviceResult(list, err)})
	}
	file["register_legacy_decode"], section = section, nil
	for _, c := range in.RegisterJSONEncode {
		value := device.MarshalNodeDevices(c.Devices)
		list, err := device.UnMarshalNodeDevices(value)
		section = append(section, obj{
			"name": c.Name, "devices": devicesOut(c.Devices), "value": value,
			"go_decoded": deviceResult(list, err),
		})
	}
	file["register_json_encode"], section = section, nil
	for _, c := range in.RegisterLegacyEncode {
		value := device.EncodeNodeDevices(c.Devices)
		list, err := device.DecodeNodeDevices(value)
		section = append(section, obj{
			"name": c.Name, "devices": devicesOut(c.Devices), "value": value,
			"go_decoded": deviceResult(list, err),
		})
	}
	file["register_legacy_encode"], section = section, nil
	for _, c := range in.RegisterPythonForm {
		asJSON, errJSON := device.UnMarshalNodeDevices(c.Value)
		legacy, errLegacy := device.DecodeNodeDevices(c.Value)
		section = append(section, obj{
			"name": c.Name, "devices": devicesOut(c.Devices), "value": c.Value,
			"go_json_reader":           deviceResult(asJSON, errJSON),
			"go_legacy_reader":         deviceResult(legacy, errLegacy),
			"go_nvidia_getnodedevices": getNodeDevices(gpuConfig, &c.Value),
		})
	}
	file["register_python_form"], section = section, nil

	allocated := device.SupportDevices[nvidia.NvidiaGPUDevice]
	for _, c := range in.PodDevicesDecode {
		got := obj{"ok": true}
		pd, err := device.DecodePodDevices(map[string]string{nvidia.NvidiaGPUDevice: allocated},
			map[string]string{allocated: c.Value})
		if err != nil {
			got = obj{"ok": false, "error": err.Error()}
		} else {
			got["containers"] = containersOut(pd[nvidia.NvidiaGPUDevice])
		}
		single := obj{"ok": true}
		cd, err := device.DecodeContainerDevices(c.Value)
		if err != nil {
			single = obj{"ok": false, "error": err.Error()}
		} else {
			single["devices"] = containerOut(cd)
		}
		section = append(section, obj{"name": c.Name, "value": c.Value, "go": got, "go_container_decoder": single})
	}
	file["pod_devices_decode"], section = section, nil
	for _, c := range in.PodDevicesEncode {
		section = append(section, podEncode(c.Name, c.Containers))
	}
	file["pod_devices_encode"], section = section, nil

	for _, c := range in.Handshake {
		// Go stamps its patch with its own clock reading, to the second; a case whose
		// reading fell in the second after now_utc is run again, so that a reader judging the
		// case at now_utc expects the very stamp Go wrote.
		var v obj
		var err error
		sameSecond := false
		for try := 0; try < 3 && !sameSecond; try++ {
			if v, sameSecond, err = handshake(gpuConfig, c.Name, c.Value, c.Allocatable); err != nil {
				return fmt.Errorf("case %s: %w", c.Name, err)
			}
		}
		if !sameSecond {
			return fmt.Errorf("case %s: Go's stamp never fell in the second of now_utc", c.Name)
		}
		section = append(section, v)
	}
	file["handshake"], section = section, nil

	for _, c := range in.NodeLockParse {
		section = append(section, obj{"name": c.Name, "value": c.Value, "go": parseLock(c.Value)})
	}
	file["node_lock_parse"], section = section, nil
	for _, c := range in.NodeLockGenerate {
		// GenerateNodeLockKeyByPod writes the time in the process zone.
		time.Local = time.FixedZone("", c.ZoneOffS)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Pod}}
		value := nodelock.GenerateNodeLockKeyByPod(pod)
		time.Local = time.UTC
		section = append(section, obj{
			"name": c.Name, "namespace": c.Namespace, "pod": c.Pod, "zone_offset_s": c.ZoneOffS,
			"value": value, "go": parseLock(value),
		})
	}
	file["node_lock_generate"] = section

	body, err := json.MarshalIndent(file, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(outPath, append(body, '\n'), 0o644)
}

// deviceOut is one DeviceInfo as the file records it: its scheduler fields, the vendor
// word when set, and how many MIG profiles it carries.
func deviceOut(d *device.DeviceInfo) obj {
	m := obj{
		"id": d.ID, "index": d.Index, "count": d.Count, "devmem": d.Devmem, "devcore": d.Devcore,
		"type": d.Type, "numa": d.Numa, "mode": d.Mode, "health": d.Health,
	}
	if d.DeviceVendor != "" {
		m["devicevendor"] = d.DeviceVendor
	}
	if len(d.MIGProfiles) > 0 {
		m["mig_profiles"] = len(d.MIGProfiles)
	}
	return m
}

func devicesOut(list []*device.DeviceInfo) []obj {
	out := []obj{}
	for _, d := range list {
		out = append(out, deviceOut(d))
	}
	return out
}

// deviceResult records a register reader's answer; a JSON null item is a nil device,
// which no device list can hold, so it is named instead.
func deviceResult(list []*device.DeviceInfo, err error) obj {
	if err != nil {
		return obj{"ok": false, "error": err.Error()}
	}
	for _, d := range list {
		if d == nil {
			return obj{"ok": true, "error": "nil device in list (a JSON null item)"}
		}
	}
	if len(list) == 0 {
		return obj{"ok": true}
	}
	return obj{"ok": true, "devices": devicesOut(list)}
}

// getNodeDevices is Go HAMi 2.10's NVIDIA scheduler reading a node's register value
// (nil: the node has none). A panic is recorded, not fatal: Go's reader does panic on some
// values, which is part of what the file pins.
func getNodeDevices(cfg nvidia.NvidiaConfig, value *string) (result obj) {
	node := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{}}}
	if value != nil {
		node.Annotations[nvidia.RegisterAnnos] = *value
	}
	defer func() {
		if r := recover(); r != nil {
			result = obj{"ok": false, "error": "PANIC: " + fmt.Sprint(r)}
		}
	}()
	list, err := nvidia.InitNvidiaDevice(cfg).GetNodeDevices(node)
	return deviceResult(list, err)
}

func containerOut(cd device.ContainerDevices) []obj {
	out := []obj{}
	for _, d := range cd {
		out = append(out, obj{"uuid": d.UUID, "type": d.Type, "usedmem": d.Usedmem, "usedcores": d.Usedcores})
	}
	return out
}

func containersOut(pd device.PodSingleDevice) [][]obj {
	out := [][]obj{}
	for _, cd := range pd {
		out = append(out, containerOut(cd))
	}
	return out
}

// podEncode writes each vendor's containers with Go's pod-devices writers and reads the
// annotations back with Go's reader.
func podEncode(name string, containers map[string][][]podDevice) obj {
	pd := device.PodDevices{}
	for vendor, entries := range containers {
		single := device.PodSingleDevice{}
		for _, entry := range entries {
			cd := device.ContainerDevices{}
			for _, d := range entry {
				cd = append(cd, device.ContainerDevice{UUID: d.UUID, Type: d.Type, Usedmem: d.Usedmem, Usedcores: d.Usedcores})
			}
			single = append(single, cd)
		}
		pd[vendor] = single
	}
	singles := obj{}
	for vendor, single := range pd {
		singles[vendor] = device.EncodePodSingleDevice(single)
	}
	annotations := device.EncodePodDevices(device.SupportDevices, pd)
	v := obj{"name": name, "containers": containers, "go_single": singles, "go_annotations": annotations}
	decoded, err := device.DecodePodDevices(device.SupportDevices, annotations)
	if err != nil {
		v["go_decoded"] = obj{}
		v["go_decode_error"] = err.Error()
		return v
	}
	back := obj{}
	for vendor, single := range decoded {
		back[vendor] = containersOut(single)
	}
	v["go_decoded"] = back
	return v
}

// stamp is a handshake input's {now-10s}, {now-1h:dots} or {now-1h:rfc3339}.
var stamp = regexp.MustCompile(`\{now-(\w+?)(?::(\w+))?\}`)

func expand(value string, now time.Time) (string, error) {
	var bad error
	out := stamp.ReplaceAllStringFunc(value, func(m string) string {
		parts := stamp.FindStringSubmatch(m)
		ago, err := time.ParseDuration(parts[1])
		if err != nil {
			bad = err
			return m
		}
		layout := map[string]string{"": time.DateTime, "dots": "2006.01.02 15:04:05", "rfc3339": time.RFC3339}[parts[2]]
		if layout == "" {
			bad = fmt.Errorf("unknown layout %q", parts[2])
		}
		return now.Add(-ago).UTC().Format(layout)
	})
	return out, bad
}

// handshake runs Go's generic health check (device.CheckHealth) and the NVIDIA scheduler's
// first pass over a node (a fresh NvidiaGPUDevices) on a node whose kubelet advertises
// `allocatable` GPUs, recording the handshake patch Go sends to the API server.
func handshake(cfg nvidia.NvidiaConfig, name string, template *string, allocatable int64) (obj, bool, error) {
	now := time.Now()
	var value any
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Annotations: map[string]string{
			nvidia.RegisterAnnos: `[{"id":"GPU-a","count":10,"health":true}]`,
		}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceName(cfg.ResourceCountName): *resource.NewQuantity(allocatable, resource.DecimalSI),
		}},
	}
	if template != nil {
		text, err := expand(*template, now)
		if err != nil {
			return nil, false, err
		}
		node.Annotations[nvidia.HandshakeAnnos] = text
		value = text
	}
	patch := ""
	client.KubeClient = fakeClient(node, &patch)
	healthy, needUpdate := device.CheckHealth(nvidia.NvidiaGPUDevice, cfg.ResourceCountName, node.DeepCopy())
	client.KubeClient = fakeClient(node, new(string))
	firstHealthy, firstUpdate := nvidia.InitNvidiaDevice(cfg).CheckHealth(nvidia.NvidiaGPUDevice, node.DeepCopy())
	sameSecond := patch == "" || strings.Contains(patch, "Requesting_"+now.UTC().Format(time.DateTime))
	return obj{
		"name":                 name,
		"value":                value,
		"allocatable":          allocatable,
		"now_utc":              now.UTC().Format(time.RFC3339Nano),
		"go":                   obj{"healthy": healthy, "need_update": needUpdate, "patch": patch},
		"go_nvidia_first_pass": obj{"healthy": firstHealthy, "need_update": firstUpdate},
	}, sameSecond, nil
}

// fakeClient holds the node and keeps the body of the last patch sent for it.
func fakeClient(node *corev1.Node, patch *string) *fake.Clientset {
	c := fake.NewClientset(node.DeepCopy())
	c.PrependReactor("patch", "nodes", func(a k8stesting.Action) (bool, runtime.Object, error) {
		*patch = string(a.(k8stesting.PatchAction).GetPatch())
		return false, nil, nil
	})
	return c
}

func parseLock(value string) obj {
	when, ns, pod, err := nodelock.ParseNodeLock(value)
	if err != nil {
		return obj{"ok": false, "error": err.Error()}
	}
	return obj{"ok": true, "time_utc": when.UTC().Format(time.RFC3339Nano), "namespace": ns, "pod": pod}
}
