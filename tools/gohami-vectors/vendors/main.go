// Command vendors hands the inputs of cases.json to Go HAMi's own device functions for the
// vendors this project models besides NVIDIA (Cambricon MLU as Go HAMi 2.10 reads it from
// kubelet capacity, Hygon DCU, every Huawei Ascend and Iluvatar type of Go HAMi's chart, Moore Threads,
// Kunlunxin's kunlun and XPU types, MetaX's Metax-GPU and Metax-SGPU types): how
// a Node's devices are read (GetNodeDevices), whether the webhook takes a container, what it
// writes into it and what it asks for (MutateAdmission, GenerateResourceRequests), the pod
// annotations a decision writes (PatchAnnotations) and, for Ascend, Iluvatar, Moore Threads,
// Kunlunxin and MetaX, which devices of a node a request gets (Fit: vNPU templates, 910C modules, whole
// devices, Kunlunxin card sets, MetaX QoS policies). It writes what each returned,
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
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/device/ascend"
	"github.com/Project-HAMi/HAMi/pkg/device/cambricon"
	"github.com/Project-HAMi/HAMi/pkg/device/hygon"
	"github.com/Project-HAMi/HAMi/pkg/device/iluvatar"
	"github.com/Project-HAMi/HAMi/pkg/device/kunlun"
	"github.com/Project-HAMi/HAMi/pkg/device/metax"
	"github.com/Project-HAMi/HAMi/pkg/device/mthreads"
	"github.com/Project-HAMi/HAMi/pkg/util"
)

const functions = "CambriconDevices.GetNodeDevices, CambriconDevices.MutateAdmission, " +
	"CambriconDevices.GenerateResourceRequests, CambriconDevices.PatchAnnotations, " +
	"DCUDevices.GetNodeDevices, DCUDevices.MutateAdmission, " +
	"DCUDevices.GenerateResourceRequests, DCUDevices.PatchAnnotations, " +
	"ascend.Devices.GetNodeDevices, ascend.Devices.MutateAdmission, " +
	"ascend.Devices.GenerateResourceRequests, ascend.Devices.PatchAnnotations, ascend.Devices.Fit, " +
	"IluvatarDevices.GetNodeDevices, IluvatarDevices.MutateAdmission, " +
	"IluvatarDevices.GenerateResourceRequests, IluvatarDevices.PatchAnnotations, IluvatarDevices.Fit, " +
	"MthreadsDevices.GetNodeDevices, MthreadsDevices.MutateAdmission, " +
	"MthreadsDevices.GenerateResourceRequests, MthreadsDevices.PatchAnnotations, MthreadsDevices.Fit, " +
	"KunlunDevices.GetNodeDevices, KunlunDevices.MutateAdmission, " +
	"KunlunDevices.GenerateResourceRequests, KunlunDevices.PatchAnnotations, KunlunDevices.Fit, " +
	"KunlunVDevices.GetNodeDevices, KunlunVDevices.MutateAdmission, " +
	"KunlunVDevices.GenerateResourceRequests, KunlunVDevices.PatchAnnotations, KunlunVDevices.Fit, " +
	"MetaxDevices.GetNodeDevices, MetaxDevices.MutateAdmission, " +
	"MetaxDevices.GenerateResourceRequests, MetaxDevices.PatchAnnotations, MetaxDevices.Fit, " +
	"MetaxSDevices.GetNodeDevices, MetaxSDevices.MutateAdmission, " +
	"MetaxSDevices.GenerateResourceRequests, MetaxSDevices.PatchAnnotations, MetaxSDevices.Fit"

// predicateTime stands for the value Ascend's PatchAnnotations writes under "predicate-time"
// (the time of the call), so that the file does not change with every run.
const predicateTime = "<unix seconds>"

// metaxPredicateTime stands for the time of the call MetaX's sGPU PatchAnnotations writes under
// metax-tech.com/predicate-time.
const metaxPredicateTime = "<unix nanoseconds>"

// mthreadsPredicateTime stands for the time of the call Moore Threads' PatchAnnotations
// writes under mthreads.com/predicate-time.
const mthreadsPredicateTime = "<unix nanoseconds>"

type obj = map[string]any

// vendorDevices is the part of Go HAMi's device interface the file records.
type vendorDevices interface {
	GetNodeDevices(n corev1.Node) ([]*device.DeviceInfo, error)
	MutateAdmission(ctr *corev1.Container, p *corev1.Pod) (bool, error)
	GenerateResourceRequests(ctr *corev1.Container) device.ContainerDeviceRequest
	PatchAnnotations(pod *corev1.Pod, annoinput *map[string]string, pd device.PodDevices) map[string]string
}

// fitter is a vendor whose Fit the file records.
type fitter interface {
	vendorDevices
	CommonWord() string
	Fit(devices []*device.DeviceUsage, request device.ContainerDeviceRequest, pod *corev1.Pod,
		nodeInfo *device.NodeInfo, allocated *device.PodDevices) (bool, map[string]device.ContainerDevices, string)
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
		// The pod's annotations (Ascend's huawei.com/vnpu-mode); absent: none.
		PodAnnotations map[string]string `json:"pod_annotations,omitempty"`
	} `json:"containers"`
	PodValues []struct {
		Name           string            `json:"name"`
		Vendor         string            `json:"vendor"`
		Containers     [][]podDevice     `json:"containers"`
		PodAnnotations map[string]string `json:"pod_annotations,omitempty"`
	} `json:"pod_values"`
	// Which devices of a node one container gets (Ascend's Fit), after the webhook.
	Fits []struct {
		Name            string            `json:"name"`
		Vendor          string            `json:"vendor"`
		Devices         []fitDevice       `json:"devices"`
		Container       json.RawMessage   `json:"container"`
		PodAnnotations  map[string]string `json:"pod_annotations,omitempty"`
		NodeAnnotations map[string]string `json:"node_annotations,omitempty"`
	} `json:"fits"`
}

// fitDevice is one device of a node as the scheduler sees it, with what is used of it.
type fitDevice struct {
	ID        string `json:"id"`
	Index     uint   `json:"index"`
	Count     int32  `json:"count"`
	Used      int32  `json:"used"`
	Totalmem  int32  `json:"totalmem"`
	Usedmem   int32  `json:"usedmem"`
	Totalcore int32  `json:"totalcore"`
	Usedcores int32  `json:"usedcores"`
	Health    bool   `json:"health"`
	NetworkID *int   `json:"network_id,omitempty"`
	// The QoS policy a MetaX sGPU reports (CustomInfo "QosPolicy"); absent: none.
	QosPolicy *string `json:"qos_policy,omitempty"`
}

// fitRuns is how often each Fit case runs: Go picks among equally full 910C modules in map
// order, so a case whose answer varies records every answer seen.
const fitRuns = 64

func main() {
	runGenerator("vendor vectors", "cases", "inputs (cases.json)", true, run)
}

func run(casesPath, outPath, commit, command, goVersion string) error {
	var in caseFile
	if err := readJSON(casesPath, &in); err != nil {
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
	ascendFlags := flag.NewFlagSet("ascend", flag.ContinueOnError)
	ascend.ParseConfig(ascendFlags)
	if err := ascendFlags.Set("enable-ascend", "true"); err != nil {
		return err
	}
	fitters := map[string]fitter{}
	ascendDevices := map[string]*ascend.Devices{}
	for _, dev := range ascend.InitDevices(ascendConfig()) {
		vendors[dev.CommonWord()] = vendor{dev, dev.CommonWord()}
		ascendDevices[dev.CommonWord()] = dev
		fitters[dev.CommonWord()] = dev
	}
	iluvatarFlags := flag.NewFlagSet("iluvatar", flag.ContinueOnError)
	iluvatar.ParseConfig(iluvatarFlags)
	if err := iluvatarFlags.Set("enable-iluvatar", "true"); err != nil {
		return err
	}
	mthreadsConfig := mthreads.MthreadsConfig{
		ResourceCountName:  "mthreads.com/vgpu",
		ResourceMemoryName: "mthreads.com/sgpu-memory",
		ResourceCoreName:   "mthreads.com/sgpu-core",
	}
	mthreadsDevices := mthreads.InitMthreadsDevice(mthreadsConfig)
	vendors["mthreads"] = vendor{mthreadsDevices, mthreads.MthreadsGPUDevice}
	fitters["mthreads"] = mthreadsDevices
	// Kunlunxin's two types share one configuration (the chart's kunlun* values).
	kunlunConfig := kunlun.KunlunConfig{
		ResourceCountName:   "kunlunxin.com/xpu",
		ResourceVCountName:  "kunlunxin.com/vxpu",
		ResourceVMemoryName: "kunlunxin.com/vxpu-memory",
	}
	kunlunDevices := kunlun.InitKunlunDevice(kunlunConfig)
	vendors[kunlun.KunlunGPUDevice] = vendor{kunlunDevices, kunlun.KunlunGPUDevice}
	fitters[kunlun.KunlunGPUDevice] = kunlunDevices
	xpuDevices := kunlun.InitKunlunVDevice(kunlunConfig)
	vendors[kunlun.XPUDevice] = vendor{xpuDevices, kunlun.XPUDevice}
	fitters[kunlun.XPUDevice] = xpuDevices
	// MetaX's two types share one configuration (the chart's metax values).
	metaxConfig := metax.MetaxConfig{
		ResourceCountName:   "metax-tech.com/gpu",
		ResourceVCountName:  "metax-tech.com/sgpu",
		ResourceVMemoryName: "metax-tech.com/vmemory",
		ResourceVCoreName:   "metax-tech.com/vcore",
	}
	metaxDevices := metax.InitMetaxDevice(metaxConfig)
	vendors[metax.MetaxGPUDevice] = vendor{metaxDevices, metax.MetaxGPUDevice}
	fitters[metax.MetaxGPUDevice] = metaxDevices
	metaxSDevices := metax.InitMetaxSDevice(metaxConfig)
	vendors[metax.MetaxSGPUDevice] = vendor{metaxSDevices, metax.MetaxSGPUDevice}
	fitters[metax.MetaxSGPUDevice] = metaxSDevices
	iluvatarWords := []string{}
	for _, dev := range iluvatar.InitIluvatarDevice(iluvatarConfig()) {
		vendors[dev.CommonWord()] = vendor{dev, dev.CommonWord()}
		fitters[dev.CommonWord()] = dev
		iluvatarWords = append(iluvatarWords, dev.CommonWord())
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
				"ascend":   ascendConfig(),
				"iluvatar": iluvatarConfig(),
				"mthreads": obj{"resourceCountName": mthreadsConfig.ResourceCountName,
					"resourceMemoryName": mthreadsConfig.ResourceMemoryName,
					"resourceCoreName":   mthreadsConfig.ResourceCoreName},
				"kunlun": kunlunConfig,
				"metax":  metaxConfig,
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
			"ascend":                ascendKeys(ascendDevices),
			"iluvatar":              commonWordKeys(iluvatarWords),
			"mthreads":              commonWordKeys([]string{mthreads.MthreadsGPUDevice}),
			"kunlun":                commonWordKeys([]string{kunlun.KunlunGPUDevice, kunlun.XPUDevice}),
			"xpu_register":          kunlun.RegisterAnnos,
			"metax":                 commonWordKeys([]string{metax.MetaxGPUDevice, metax.MetaxSGPUDevice}),
			"metax_node_devices":    metax.MetaxSDeviceAnno,
			"metax_allocated":       metax.MetaxAllocatedSDevices,
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
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{*ctr.DeepCopy()}}}
		pod.Annotations = c.PodAnnotations
		found, mutateErr := v.devices.MutateAdmission(&pod.Spec.Containers[0], pod)
		request := v.devices.GenerateResourceRequests(&ctr)
		mutated := pod.Spec.Containers[0]
		got := obj{
			"mutate":        found,
			"request":       requestOut(request),
			"mutated":       resourcesOut(mutated),
			"request_after": requestOut(v.devices.GenerateResourceRequests(&mutated)),
		}
		if mutateErr != nil {
			got["mutate_error"] = mutateErr.Error()
		}
		if len(mutated.Env) > 0 {
			env := map[string]string{}
			for _, e := range mutated.Env {
				env[e.Name] = e.Value
			}
			got["mutated_env"] = env
		}
		item := obj{"name": c.Name, "vendor": c.Vendor, "container": c.Container, "go": got}
		if c.PodAnnotations != nil {
			item["pod_annotations"] = c.PodAnnotations
		}
		section = append(section, item)
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
		pod := &corev1.Pod{}
		pod.Annotations = c.PodAnnotations
		v.devices.PatchAnnotations(pod, &annotations, device.PodDevices{v.typeWord: single})
		if _, ok := annotations["predicate-time"]; ok {
			annotations["predicate-time"] = predicateTime
		}
		if _, ok := annotations[metax.MetaxPredicateTime]; ok {
			annotations[metax.MetaxPredicateTime] = metaxPredicateTime
		}
		if _, ok := annotations[mthreads.MthreadsPredicateTime]; ok {
			annotations[mthreads.MthreadsPredicateTime] = mthreadsPredicateTime
		}
		item := obj{
			"name": c.Name, "vendor": c.Vendor, "containers": c.Containers,
			"go": obj{"annotations": annotations},
		}
		if c.PodAnnotations != nil {
			item["pod_annotations"] = c.PodAnnotations
		}
		section = append(section, item)
	}
	file["pod_values"], section = section, nil

	for _, c := range in.Fits {
		dev, ok := fitters[c.Vendor]
		if !ok {
			return fmt.Errorf("%s: no Fit cases for %q", c.Name, c.Vendor)
		}
		var ctr corev1.Container
		if err := json.Unmarshal(c.Container, &ctr); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		got, err := fitOut(dev, c.Devices, ctr, c.PodAnnotations, c.NodeAnnotations)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
		item := obj{"name": c.Name, "vendor": c.Vendor, "devices": c.Devices, "container": c.Container, "go": got}
		if c.PodAnnotations != nil {
			item["pod_annotations"] = c.PodAnnotations
		}
		if c.NodeAnnotations != nil {
			item["node_annotations"] = c.NodeAnnotations
		}
		section = append(section, item)
	}
	file["fits"] = section

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

func requestOut(r device.ContainerDeviceRequest) obj {
	return obj{
		"nums": r.Nums, "type": r.Type, "memreq": r.Memreq,
		"mempercentagereq": r.MemPercentagereq, "coresreq": r.Coresreq,
	}
}

// resourcesOut is a container's limits and requests as quantity strings.
func resourcesOut(ctr corev1.Container) obj {
	out := obj{}
	for section, list := range map[string]corev1.ResourceList{
		"limits": ctr.Resources.Limits, "requests": ctr.Resources.Requests,
	} {
		if list == nil {
			continue
		}
		values := map[string]string{}
		for name, quantity := range list {
			values[string(name)] = quantity.String()
		}
		out[section] = values
	}
	return out
}

// fitOut runs the webhook on the container, derives its request from what the webhook wrote
// and hands it to Fit over the case's devices (in the order given) fitRuns times.
func fitOut(dev fitter, devices []fitDevice, ctr corev1.Container, podAnnos, nodeAnnos map[string]string) (obj, error) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{ctr}}}
	pod.Name, pod.Namespace, pod.Annotations = "p", "default", podAnnos
	if _, err := dev.MutateAdmission(&pod.Spec.Containers[0], pod); err != nil {
		return obj{"mutate_error": err.Error()}, nil
	}
	request := dev.GenerateResourceRequests(&pod.Spec.Containers[0])
	node := &corev1.Node{}
	node.Name, node.Annotations = "npu-node", nodeAnnos
	answers := []obj{}
	seen := map[string]bool{}
	for range fitRuns {
		usage := make([]*device.DeviceUsage, 0, len(devices))
		infos := make([]device.DeviceInfo, 0, len(devices))
		for _, d := range devices {
			var custom map[string]any
			if d.NetworkID != nil {
				custom = map[string]any{"NetworkID": float64(*d.NetworkID)}
			}
			if d.QosPolicy != nil {
				custom = map[string]any{"QosPolicy": *d.QosPolicy}
			}
			usage = append(usage, &device.DeviceUsage{
				ID: d.ID, Index: d.Index, Used: d.Used, Count: d.Count, Usedmem: d.Usedmem,
				Totalmem: d.Totalmem, Totalcore: d.Totalcore, Usedcores: d.Usedcores,
				Type: dev.CommonWord(), Health: d.Health, CustomInfo: custom,
			})
			infos = append(infos, device.DeviceInfo{
				ID: d.ID, Index: d.Index, Count: d.Count, Devmem: d.Totalmem,
				Devcore: d.Totalcore, Type: dev.CommonWord(), Health: d.Health, CustomInfo: custom,
			})
		}
		info := &device.NodeInfo{ID: node.Name, Node: node, Devices: map[string][]device.DeviceInfo{dev.CommonWord(): infos}}
		ok, chosen, reason := dev.Fit(usage, request, pod, info, &device.PodDevices{})
		picked := []obj{}
		if ok {
			for _, c := range chosen[dev.CommonWord()] {
				picked = append(picked, obj{"uuid": c.UUID, "idx": c.Idx, "usedmem": c.Usedmem, "usedcores": c.Usedcores})
			}
		}
		answer := obj{"fits": ok, "devices": picked, "reason": reason}
		key, err := json.Marshal(answer)
		if err != nil {
			return nil, err
		}
		if !seen[string(key)] {
			seen[string(key)] = true
			answers = append(answers, answer)
		}
	}
	// The answers in a fixed order (by their JSON), so that the file does not depend on the
	// order Go's map happened to give them in.
	keys := make([]string, 0, len(seen))
	for key := range seen {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	answers = answers[:0]
	for _, key := range keys {
		var answer obj
		if err := json.Unmarshal([]byte(key), &answer); err != nil {
			return nil, err
		}
		answers = append(answers, answer)
	}
	return obj{"request": requestOut(request), "answers": answers}, nil
}

func ascendKeys(devices map[string]*ascend.Devices) obj {
	words := []string{}
	for word := range devices {
		words = append(words, word)
	}
	return commonWordKeys(words)
}

// commonWordKeys is the pod and heartbeat keys Go registered for each device type.
func commonWordKeys(words []string) obj {
	out := obj{}
	for _, word := range words {
		out[word] = obj{
			"to_allocate": device.InRequestDevices[word],
			"allocated":   device.SupportDevices[word],
			"handshake":   util.HandshakeAnnos[word],
		}
	}
	return out
}

// ascendConfig is the vnpus section of Go HAMi's Helm chart (the device ConfigMap of
// charts/hami at this commit), with its defaults: no runtime class, overwriteEnv false,
// hamiVnpuCore false.
func ascendConfig() ascend.VNPUs {
	type tmpl = ascend.Template
	chip := func(word, chipName string, memory, capacity int64, aiCore, aiCPU int32, superPod bool, templates ...tmpl) ascend.VNPUConfig {
		return ascend.VNPUConfig{
			CommonWord: word, ChipName: chipName,
			ResourceName:       "huawei.com/" + word,
			ResourceMemoryName: "huawei.com/" + word + "-memory",
			ResourceCoreName:   "huawei.com/" + word + "-core",
			MemoryAllocatable:  memory, MemoryCapacity: capacity, MemoryFactor: 1,
			AICore: aiCore, AICPU: aiCPU, SuperPod: superPod, Templates: templates,
		}
	}
	return ascend.VNPUs{Configs: []ascend.VNPUConfig{
		chip("Ascend910A", "910A", 32768, 32768, 30, 0, false,
			tmpl{Name: "vir02", Memory: 2184, AICore: 2}, tmpl{Name: "vir04", Memory: 4369, AICore: 4},
			tmpl{Name: "vir08", Memory: 8738, AICore: 8}, tmpl{Name: "vir16", Memory: 17476, AICore: 16}),
		chip("Ascend910B2", "910B2", 65536, 65536, 24, 6, false,
			tmpl{Name: "vir03_1c_8g", Memory: 8192, AICore: 3, AICPU: 1},
			tmpl{Name: "vir06_1c_16g", Memory: 16384, AICore: 6, AICPU: 1},
			tmpl{Name: "vir12_3c_32g", Memory: 32768, AICore: 12, AICPU: 3}),
		chip("Ascend910B3", "910B3", 65536, 65536, 20, 7, false,
			tmpl{Name: "vir05_1c_16g", Memory: 16384, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_32g", Memory: 32768, AICore: 10, AICPU: 3}),
		chip("Ascend910B4-1", "910B4-1", 65536, 65536, 20, 7, false,
			tmpl{Name: "vir05_1c_16g", Memory: 16384, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_32g", Memory: 32768, AICore: 10, AICPU: 3}),
		chip("Ascend910B4", "910B4", 32768, 32768, 20, 7, false,
			tmpl{Name: "vir05_1c_8g", Memory: 8192, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_16g", Memory: 16384, AICore: 10, AICPU: 3}),
		chip("Ascend310P", "310P3", 21527, 24576, 8, 7, false,
			tmpl{Name: "vir01", Memory: 3072, AICore: 1, AICPU: 1},
			tmpl{Name: "vir02", Memory: 6144, AICore: 2, AICPU: 2},
			tmpl{Name: "vir04", Memory: 12288, AICore: 4, AICPU: 4}),
		chip("Ascend910C", "Ascend910", 65536, 65536, 20, 7, true,
			tmpl{Name: "vir05_1c_16g", Memory: 16384, AICore: 5, AICPU: 1},
			tmpl{Name: "vir10_3c_32g", Memory: 32768, AICore: 10, AICPU: 3}),
	}}
}

// iluvatarConfig is the iluvatars section of Go HAMi's Helm chart (the device ConfigMap of
// charts/hami at this commit).
func iluvatarConfig() []iluvatar.IluvatarConfig {
	out := []iluvatar.IluvatarConfig{}
	for _, word := range []string{"MR-V100", "MR-V50", "BI-V150", "BI-V100"} {
		out = append(out, iluvatar.IluvatarConfig{
			CommonWord: word, ChipName: word,
			ResourceCountName:  "iluvatar.ai/" + word + "-vgpu",
			ResourceMemoryName: "iluvatar.ai/" + word + ".vMem",
			ResourceCoreName:   "iluvatar.ai/" + word + ".vCore",
		})
	}
	return out
}
