"""NCCL topology XML: the Azure ND H100 v5 file, and a synthetic dump with NVLinks."""

from pathlib import Path

import pytest

from orchestrator.topology.nccl_xml import mask_to_cpu_list, parse_nccl_topo_xml

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "topo"


def test_azure_ndv5_hidden_switches():
    t = parse_nccl_topo_xml((FIX / "nccl_topo_azure_ndv5_h100.xml.txt").read_text())
    assert [g.pci_bus_id for g in t.gpus] == ["0001:00:00.0", "0002:00:00.0", "0003:00:00.0",
                                              "0008:00:00.0", "0009:00:00.0", "000a:00:00.0",
                                              "000b:00:00.0", "000c:00:00.0"]
    assert [g.numa_node for g in t.gpus] == [0] * 4 + [1] * 4
    assert t.gpus[0].cpu_affinity == "48-95" and t.gpus[7].cpu_affinity == "0-47"
    assert t.link(0, 3) == "PHB" and t.link(3, 4) == "SYS"  # no NVLink in this file
    assert [n.pci_bus_id for n in t.nics][:2] == ["0101:00:00.0", "0102:00:00.0"]
    assert [n.nearest_gpus for n in t.nics] == [(i,) for i in range(8)]  # one NIC per GPU
    assert t.gpu_nic_links[(5, "NIC5")] == "PIX" and t.gpu_nic_links[(5, "NIC4")] == "PHB"
    assert [t.nearest_nic(g) for g in range(8)] == [f"NIC{g}" for g in range(8)]


SYNTH = """<system version="1">
  <cpu numaid="0" affinity="0000ffff" arch="x86_64">
    <pci busid="0000:10:00.0" class="0x060400">
      <pci busid="0000:11:00.0" class="0x060400">
        <pci busid="0000:12:00.0" class="0x030200"><gpu dev="1" sm="80">
          <nvlink target="0000:22:00.0" count="4" tclass="0x030200"/></gpu></pci>
        <pci busid="0000:13:00.0" class="0x020700"><nic>
          <net name="mlx5_3" dev="0" speed="200000" port="1"/></nic></pci>
      </pci>
      <pci busid="0000:21:00.0" class="0x060400">
        <pci busid="0000:22:00.0" class="0x030200"><gpu dev="0" sm="80">
          <nvlink target="0000:12:00.0" count="4" tclass="0x030200"/></gpu></pci>
      </pci>
    </pci>
  </cpu>
  <cpu numaid="1" affinity="ffff0000" arch="x86_64">
    <pci busid="0000:80:00.0" class="0x030200"><gpu dev="2" sm="80">
      <nvlink target="0000:c0:00.0" count="6" tclass="0x068000"/></gpu></pci>
    <pci busid="0000:90:00.0" class="0x030200"><gpu dev="3" sm="80">
      <nvlink target="0000:c1:00.0" count="6" tclass="0x068000"/></gpu></pci>
  </cpu>
</system>"""


def test_synthetic_nvlinks_bridges_and_net_names():
    t = parse_nccl_topo_xml(SYNTH)
    assert [g.pci_bus_id for g in t.gpus] == ["0000:22:00.0", "0000:12:00.0", "0000:80:00.0",
                                              "0000:90:00.0"]  # numbered by <gpu dev>
    assert t.link(0, 1) == "NV4"  # direct links, counted once per pair
    assert t.link(2, 3) == "NV6"  # both reach an NVSwitch
    assert t.link(0, 2) == "SYS"
    nic = t.nics[0]
    assert (nic.name, nic.rate_gbps, nic.nearest_gpus) == ("mlx5_3", 200.0, (1,))
    assert t.gpu_nic_links[(1, "mlx5_3")] == "PIX"
    assert t.gpu_nic_links[(0, "mlx5_3")] == "PXB"  # common bridge 10:00.0, higher up
    assert t.gpus[2].cpu_affinity == "16-31"


def test_errors_and_masks():
    with pytest.raises(ValueError, match="not an NCCL topology XML"):
        parse_nccl_topo_xml("<system>")
    with pytest.raises(ValueError, match="lists no GPU"):
        parse_nccl_topo_xml("<system><cpu numaid='0'/></system>")
    assert mask_to_cpu_list("00000000,0000ffff,ffffffff") == "0-47"
    assert mask_to_cpu_list("5") == "0,2" and mask_to_cpu_list("0") is None
